// omnitrio voice chat: a small client of the OpenAI-compatible Realtime API.
// It connects over WebRTC (webrtc.js: the microphone and the answer as tracks, the events
// on a data channel), and over the Realtime WebSocket when WebRTC fails (or with
// ?transport=websocket): then the microphone goes up as input_audio_buffer.append events
// and the reply's audio deltas are played gaplessly (player.js). Either way the transcript
// streams into the page. Where the server detects turns itself (server_vad), "Hands-free"
// streams the microphone and the server decides when a turn ends, answers it, and stops
// the answer when we talk over it.

import { base64ToFloat32, openMicrophone, pcm16ToBase64 } from "./audio.js";
import { createPlayer } from "./player.js";
import { connectWebRtc } from "./webrtc.js";

const INPUT_RATE_HZ = 24000; // the server expects PCM16 mono at 24 kHz
const SEND_INTERVAL_MS = 100; // how often recorded audio goes up as input_audio_buffer.append

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), connectForm: $("connect-form"), apiKey: $("api-key"),
  connect: $("connect"), transcript: $("transcript"), textForm: $("text-form"),
  text: $("text"), send: $("send"), talk: $("talk"), stop: $("stop"), handsFree: $("hands-free"),
  latency: $("latency"), errors: $("errors"), hint: $("hint"),
};

// What the page has seen, for people and for tests (tests/web/test_web_page.py reads it).
const omnitrio = (window.omnitrio = {
  state: "idle", // idle | connecting | connected | closed
  recording: false, responding: false,
  audioSecondsSent: 0, audioSecondsReceived: 0,
  audioSecondsPlayed: 0, // heard: counted by the playback worklet as it plays
  underruns: 0, // times playback ran dry mid-reply
  firstAudioMs: [], // time to first audio, per turn
  playback: "", // "worklet", or "scheduled" where the browser lacks AudioWorklet
  transcript: "", errors: [], eventCounts: {},
  serverVad: false, // the server can detect turns (its session.created had turn_detection)
  handsFree: false, // we are streaming the microphone and the server detects turns
  keepAudio: false, // tests set it: audio sent and received is kept (base64 PCM16)
  sentAudio: [], replyAudio: [], userTranscripts: [],
  truncatedAtMs: [], // audio_end_ms of each conversation.item.truncate sent on barge-in
  transport: null, // "webrtc" or "websocket" once connected
  fallbackReason: null, // why WebRTC was not used, when the page fell back to the WebSocket
  rtc: null, // the WebRTC call (webrtc.js), while connected over WebRTC
});
const WANT_WEBRTC = new URLSearchParams(location.search).get("transport") !== "websocket";

// The assistant item whose audio is playing, and how much of it was heard: on barge-in
// the page sends conversation.item.truncate, so the conversation keeps what was heard.
let heard = null; // {itemId, seconds}

const player = createPlayer({
  onPlayed: (seconds) => {
    omnitrio.audioSecondsPlayed += seconds;
    if (heard) heard.seconds += seconds;
  },
  onUnderrun: (total) => (omnitrio.underruns = total),
  onChange: updateStop, onError: showError,
});
omnitrio.playback = player.kind;

let ws = null; // the connection: a WebSocket, or a WebRTC call (omnitrio.rtc) with its send/close
let rtcPlaying = false; // WebRTC: the server is playing an answer on the track
let rtcTalkStartedAt = null; // WebRTC push-to-talk: when the microphone was opened
let outputRateHz = 24000; // replaced by session.created's session.audio.output.format.rate
// The server runs one response at a time. `reply` is ours from our response.create to
// its response.done: {eventId of the create, id (from response.created), cancelled}.
let reply = null;
let createQueued = false; // a response.create waiting for the cancelled reply's response.done
let numSent = 0; // for our event_ids, which the server quotes in its errors
const cancelledIds = new Set(); // responses we cancelled: their late deltas are dropped
let turnStartedAt = null; // performance.now() when we asked for a response
const replyLines = new Map(); // response id -> its <li> in the transcript
let mic = null; // the open microphone while recording
let micStarting = false;
// A spoken turn is one user line: made when the turn is committed (push-to-talk: when we
// send it; hands-free: when the server commits it), then its text becomes the transcript.
const spokenWaiting = []; // our committed turns' lines, until input_audio_buffer.committed
const spokenLines = new Map(); // item id -> its <li>, until its transcript comes
let speechStartMs = null; // hands-free: where the server heard the turn start (audio ms) ...
let speechStopMs = null; // ... and end

// ---------------------------------------------------------------- page state

function setState(state, detail = "") {
  omnitrio.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = detail ? `${state} · ${detail}` : state;
  ui.connect.textContent = ws ? "Disconnect" : "Connect";
  ui.apiKey.disabled = ws !== null;
  for (const el of [ui.text, ui.send, ui.talk]) el.disabled = state !== "connected";
  ui.talk.disabled ||= omnitrio.handsFree;
  ui.handsFree.hidden = !omnitrio.serverVad;
  ui.handsFree.disabled = state !== "connected" || micStarting || (mic !== null && !omnitrio.handsFree);
  ui.hint.textContent = hint(state);
  updateStop();
}

// What the user can do now, in one line under the controls.
function hint(state) {
  if (state !== "connected") return "Press Connect to start.";
  if (omnitrio.handsFree) {
    return "Hands-free: just talk. The answer comes when you pause; talk over it to stop it. " +
      "Press Hands-free again to stop listening.";
  }
  const typeOrTalk = "Type a message, or press Talk, speak, and press Talk again to send.";
  if (!omnitrio.serverVad) return typeOrTalk;
  return `${typeOrTalk} Or press Hands-free and just talk: the answer comes when you pause.`;
}

function updateStop() {
  ui.stop.disabled = !(omnitrio.responding || playing());
}

function showError(message) {
  omnitrio.errors.push(message);
  const li = document.createElement("li");
  li.textContent = message;
  ui.errors.append(li);
}

function addLine(role, text) {
  const li = document.createElement("li");
  li.className = role;
  li.textContent = text;
  ui.transcript.append(li);
  ui.transcript.scrollTop = ui.transcript.scrollHeight; // the newest line in view
  return li;
}

// ---------------------------------------------------------------- connection

async function connect() {
  const key = ui.apiKey.value.trim();
  player.ensure(); // create the AudioContext inside this click, so autoplay allows it
  if (WANT_WEBRTC) {
    const pending = { close() {} };
    ws = pending; // connecting: the button reads Disconnect
    setState("connecting", "WebRTC");
    try {
      const call = await connectWebRtc({
        apiKey: key, onEvent: handle, audio: $("answer-audio"),
        onClose: (why) => { if (ws === call) { showError(why); hangUp("closed", why); } },
      });
      if (ws !== pending) return call.close(); // the user left meanwhile
      call.setMicrophone(false); // push-to-talk until Talk or Hands-free
      ws = call;
      omnitrio.rtc = call;
      omnitrio.transport = "webrtc";
      return;
    } catch (err) {
      if (ws !== pending) return;
      ws = null;
      omnitrio.fallbackReason = err.message;
    }
  }
  connectWebSocket(key);
}

function connectWebSocket(key) {
  // Browsers cannot set headers on a WebSocket: the key travels as a subprotocol.
  const protocols = key ? ["realtime", `openai-insecure-api-key.${key}`] : ["realtime"];
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/v1/realtime`, protocols);
  ws = socket;
  omnitrio.transport = "websocket";
  setState("connecting", "WebSocket");
  socket.onmessage = (message) => {
    if (typeof message.data === "string") handle(JSON.parse(message.data));
  };
  let opened = false;
  socket.onopen = () => (opened = true);
  // A failed socket fires "error" then "close"; the close event says more, so report there.
  socket.onclose = (e) => {
    if (ws !== socket) return; // a socket the user already left
    const why = `code ${e.code}${e.reason ? `, ${e.reason}` : ""}`;
    if (!opened) {
      showError("could not connect: server unreachable, or it refused us (is the API key right?)");
    } else if (e.code !== 1000 && e.code !== 1005) {
      showError(`connection closed (${why})`);
    }
    hangUp("closed", why);
  };
}

function hangUp(state, detail) {
  const socket = ws;
  ws = null;
  stopRecording({ commit: false });
  omnitrio.handsFree = false;
  ui.handsFree.setAttribute("aria-pressed", "false");
  player.stop();
  reply = null;
  createQueued = false;
  omnitrio.responding = false;
  spokenWaiting.length = 0;
  spokenLines.clear();
  rtcPlaying = false;
  omnitrio.rtc = null;
  if (socket instanceof WebSocket) {
    if (socket.readyState <= WebSocket.OPEN) socket.close(1000, "bye");
  } else if (socket) {
    socket.close();
  }
  setState(state, detail);
}

function send(event) {
  if (ws instanceof WebSocket) {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
  } else if (ws) {
    ws.send(event);
  }
}

const overWebRtc = () => omnitrio.transport === "webrtc" && omnitrio.rtc !== null;
const playing = () => (overWebRtc() ? rtcPlaying : player.busy());

function requestResponse() {
  bargeIn();
  // The server refuses a response.create while a reply is active, even a cancelled one:
  // then it goes out when that reply's response.done comes.
  if (reply) createQueued = true;
  else sendCreate();
}

function sendCreate() {
  createQueued = false;
  reply = { eventId: `evt_page_${++numSent}`, id: null, cancelled: false };
  omnitrio.responding = true;
  send({ type: "response.create", event_id: reply.eventId });
  turnStartedAt = performance.now();
  updateStop();
}

function endReply() {
  reply = null;
  omnitrio.responding = false;
  if (createQueued) sendCreate();
  updateStop();
}

// Stop the reply now: cancel it on the server and silence what is already queued.
function bargeIn() {
  if (reply && !reply.cancelled) {
    send({ type: "response.cancel", event_id: `evt_page_${++numSent}` });
    reply.cancelled = true;
    if (reply.id) cancelledIds.add(reply.id);
  }
  stopPlaying();
}

// Silence the reply and tell the server how much of its audio was heard. Over WebRTC the
// server plays the reply: it cuts its track and truncates to what it played.
function stopPlaying() {
  if (overWebRtc()) {
    if (rtcPlaying) send({ type: "output_audio_buffer.clear", event_id: `evt_page_${++numSent}` });
    rtcPlaying = false;
    heard = null;
    updateStop();
    return;
  }
  if (heard && player.busy()) {
    const audioEndMs = Math.floor(heard.seconds * 1000);
    omnitrio.truncatedAtMs.push(audioEndMs);
    send({
      type: "conversation.item.truncate",
      event_id: `evt_page_${++numSent}`,
      item_id: heard.itemId,
      content_index: 0,
      audio_end_ms: audioEndMs,
    });
  }
  heard = null;
  player.stop();
  updateStop();
}

// ---------------------------------------------------------------- server events

function handle(event) {
  omnitrio.eventCounts[event.type] = (omnitrio.eventCounts[event.type] || 0) + 1;
  handlers[event.type]?.(event);
}

function onSession(event) {
  const rate = event.session?.audio?.output?.format?.rate;
  if (Number.isInteger(rate) && rate > 0) outputRateHz = rate;
  if (event.type !== "session.created") return;
  omnitrio.serverVad = Boolean(event.session?.audio?.input?.turn_detection);
  // Push-to-talk until the user picks hands-free: then the server finds the turns.
  if (omnitrio.serverVad) setTurnDetection(false);
  setState("connected", `${outputRateHz} Hz audio`);
}

function setTurnDetection(on) {
  const detection = on ? { type: "server_vad" } : null;
  send({ type: "session.update", session: { type: "realtime", audio: { input: { turn_detection: detection } } } });
}

function onAudioDelta(event) {
  if (cancelledIds.has(event.response_id)) return;
  if (omnitrio.keepAudio) omnitrio.replyAudio.push(event.delta);
  const samples = base64ToFloat32(event.delta);
  omnitrio.audioSecondsReceived += samples.length / outputRateHz;
  if (turnStartedAt !== null) {
    const ms = Math.round(performance.now() - turnStartedAt);
    omnitrio.firstAudioMs.push(ms);
    ui.latency.textContent = `first audio: ${ms} ms`;
    turnStartedAt = null;
  }
  player.enqueue(samples, outputRateHz);
  updateStop();
}

function onTextDelta(event) {
  if (cancelledIds.has(event.response_id)) return;
  let li = replyLines.get(event.response_id);
  if (!li) {
    li = addLine("assistant", "");
    replyLines.set(event.response_id, li);
  }
  li.textContent += event.delta;
  ui.transcript.scrollTop = ui.transcript.scrollHeight; // follow it as it grows
  omnitrio.transcript += event.delta;
}

// WebRTC: the server says when the reply's audio starts and stops on the track.
function onPlaybackStarted() {
  rtcPlaying = true;
  if (turnStartedAt !== null) {
    const ms = Math.round(performance.now() - turnStartedAt);
    omnitrio.firstAudioMs.push(ms);
    ui.latency.textContent = `first audio: ${ms} ms`;
    turnStartedAt = null;
  }
  updateStop();
}

function onPlaybackEnded() {
  rtcPlaying = false;
  updateStop();
}

const handlers = {
  "output_audio_buffer.started": onPlaybackStarted,
  "output_audio_buffer.stopped": onPlaybackEnded,
  "output_audio_buffer.cleared": onPlaybackEnded,
  "session.created": onSession,
  "session.updated": onSession,
  "response.created": (e) => {
    if (!reply && omnitrio.handsFree) {
      // The server answers a turn it detected: that reply is ours too.
      reply = { eventId: null, id: e.response?.id ?? null, cancelled: false };
      omnitrio.responding = true;
      updateStop();
      return;
    }
    if (!reply || reply.id !== null) return; // not one we asked for
    reply.id = e.response?.id ?? null;
    if (reply.cancelled) cancelledIds.add(reply.id); // cancelled before we knew its id
  },
  "response.done": (e) => {
    const { id, status } = e.response ?? {};
    replyLines.get(id)?.classList.add(status ?? "completed"); // e.g. "cancelled" is styled
    if (status === "failed") {
      showError(`response failed: ${JSON.stringify(e.response.status_details ?? {})}`);
    }
    player.end(); // a short last burst below the jitter threshold plays out now
    if (reply && (reply.id === id || reply.id === null)) endReply();
  },
  "response.output_item.added": (e) => {
    if (cancelledIds.has(e.response_id) || !e.item?.id) return;
    heard = { itemId: e.item.id, seconds: 0 };
  },
  "response.output_audio.done": () => player.end(),
  "response.audio.done": () => player.end(),
  // The GA names, and the older beta names some servers still send.
  "response.output_audio.delta": onAudioDelta,
  "response.audio.delta": onAudioDelta,
  "response.output_audio_transcript.delta": onTextDelta,
  "response.audio_transcript.delta": onTextDelta,
  "response.output_text.delta": onTextDelta,
  "response.text.delta": onTextDelta,
  "input_audio_buffer.committed": (e) => {
    // Ours (push-to-talk) already has its line; a turn the server found gets one now.
    let li = spokenWaiting.shift();
    if (!li) li = addLine("user", spokeFor(speechSeconds()));
    li.classList.add("spoken");
    if (e.item_id) spokenLines.set(e.item_id, li);
  },
  "conversation.item.input_audio_transcription.completed": (e) => {
    omnitrio.userTranscripts.push(e.transcript);
    const li = spokenLines.get(e.item_id);
    spokenLines.delete(e.item_id);
    if (li) li.textContent = e.transcript; // the turn's one line now says what was heard
    else addLine("user", e.transcript);
  },
  // server_vad: the server heard us start talking and cancels its reply (barge-in) ...
  "input_audio_buffer.speech_started": (e) => {
    speechStartMs = e.audio_start_ms ?? null;
    if (reply && !reply.cancelled) {
      reply.cancelled = true;
      if (reply.id) cancelledIds.add(reply.id);
    }
    stopPlaying();
  },
  // ... and stop: it commits the turn and answers; first audio is timed from here.
  "input_audio_buffer.speech_stopped": (e) => {
    turnStartedAt = performance.now();
    speechStopMs = e.audio_end_ms ?? null;
  },
  error: (e) => {
    const { code, event_id: eventId, message } = e.error ?? {};
    // A cancel that crossed the reply's response.done on the wire: nothing went wrong.
    if (code === "response_cancel_not_active" && eventId?.startsWith("evt_page_")) return;
    showError(message ?? JSON.stringify(e));
    // Our commit was refused: its line waits for no input_audio_buffer.committed.
    const waiting = spokenWaiting.findIndex((li) => li.dataset.commitEventId === eventId);
    if (waiting >= 0) spokenWaiting.splice(waiting, 1)[0].classList.add("failed");
    // Our response.create was refused: no response.done will follow.
    if (reply && reply.id === null && eventId === reply.eventId) endReply();
  },
};

// ---------------------------------------------------------------- push to talk

function speechSeconds() {
  if (speechStartMs === null || speechStopMs === null) return null;
  return (speechStopMs - speechStartMs) / 1000;
}

function spokeFor(seconds) {
  return seconds === null ? "(spoke)" : `(spoke for ${seconds.toFixed(1)} s)`;
}

async function startRecording({ bargeIn: interrupt = true } = {}) {
  if (interrupt) bargeIn(); // talking over the reply interrupts it
  if (overWebRtc()) {
    // The microphone is the call's track: open it. Push-to-talk starts a fresh buffer.
    if (!omnitrio.handsFree) send({ type: "input_audio_buffer.clear" });
    omnitrio.rtc.setMicrophone(true);
    rtcTalkStartedAt = performance.now();
    mic = { close: () => Math.round(((performance.now() - rtcTalkStartedAt) / 1000) * INPUT_RATE_HZ) };
    omnitrio.recording = true;
    if (omnitrio.handsFree) return setState(omnitrio.state);
    ui.talk.setAttribute("aria-pressed", "true");
    ui.talk.textContent = "● Recording… click to send";
    return;
  }
  micStarting = true;
  try {
    const opened = await openMicrophone({
      rateHz: INPUT_RATE_HZ,
      intervalMs: SEND_INTERVAL_MS,
      onPcm: (pcm) => {
        const audio = pcm16ToBase64(pcm);
        send({ type: "input_audio_buffer.append", audio });
        if (omnitrio.keepAudio) omnitrio.sentAudio.push(audio);
        omnitrio.audioSecondsSent += pcm.length / INPUT_RATE_HZ;
      },
    });
    if (omnitrio.state !== "connected") return opened.close(); // hung up meanwhile
    mic = opened;
  } finally {
    micStarting = false;
  }
  omnitrio.recording = true;
  if (omnitrio.handsFree) return setState(omnitrio.state);
  ui.talk.setAttribute("aria-pressed", "true");
  ui.talk.textContent = "● Recording… click to send";
}

function stopRecording({ commit }) {
  if (!mic) return;
  const samples = mic.close(); // sends what is left
  mic = null;
  if (overWebRtc()) omnitrio.rtc.setMicrophone(false);
  omnitrio.recording = false;
  ui.talk.setAttribute("aria-pressed", "false");
  ui.talk.textContent = "Talk";
  if (!commit) return;
  if (samples === 0) {
    showError("no microphone audio was captured");
    return;
  }
  // The turn's line until its transcript replaces it (it stays where there is no ASR).
  const li = addLine("user", spokeFor(samples / INPUT_RATE_HZ));
  li.dataset.commitEventId = `evt_page_${++numSent}`;
  spokenWaiting.push(li);
  send({ type: "input_audio_buffer.commit", event_id: li.dataset.commitEventId });
  requestResponse();
}

// ---------------------------------------------------------------- controls

ui.connectForm.addEventListener("submit", (e) => {
  e.preventDefault();
  if (ws) hangUp("closed", "by you");
  else connect().catch((err) => showError(`could not connect: ${err.message}`));
});

ui.textForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = ui.text.value.trim();
  if (!text) return;
  ui.text.value = "";
  addLine("user", text);
  send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  });
  requestResponse();
});

ui.talk.addEventListener("click", () => {
  if (micStarting) return;
  if (mic) stopRecording({ commit: true });
  else startRecording().catch((err) => showError(`microphone: ${err.message}`));
});

ui.handsFree.addEventListener("click", () => {
  if (micStarting) return;
  if (omnitrio.handsFree) {
    stopRecording({ commit: false });
    omnitrio.handsFree = false;
    ui.handsFree.setAttribute("aria-pressed", "false");
    setTurnDetection(false);
    setState(omnitrio.state);
    return;
  }
  omnitrio.handsFree = true;
  ui.handsFree.setAttribute("aria-pressed", "true");
  setTurnDetection(true);
  setState(omnitrio.state);
  startRecording({ bargeIn: false }).catch((err) => showError(`microphone: ${err.message}`));
});

ui.stop.addEventListener("click", bargeIn);
// Escape stops the reply from anywhere on the page, as the Stop button does.
document.addEventListener("keydown", (e) => e.key === "Escape" && !ui.stop.disabled && bargeIn());

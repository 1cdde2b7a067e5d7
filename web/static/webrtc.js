// The voice chat over WebRTC, as OpenAI's browser quick-start connects: the microphone
// (with the browser's echo cancellation and noise suppression) goes up as a track, the
// answer comes back as a track played by an <audio> element, and the Realtime events
// travel on the "oai-events" data channel. The offer goes to POST /v1/realtime/calls.

const OPEN_TIMEOUT_MS = 8000; // the data channel must open by then, or we fall back

// Resolves to a call: {send(event), close(), setMicrophone(on), stats(), recordReply()},
// once its data channel is open; rejects (the page then uses the WebSocket) when WebRTC
// is missing, the server refuses the offer, or the connection does not come up.
export async function connectWebRtc({ apiKey, onEvent, onClose, audio }) {
  if (typeof RTCPeerConnection === "undefined") throw new Error("this browser has no WebRTC");
  const microphone = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const [track] = microphone.getAudioTracks();
  const pc = new RTCPeerConnection();
  let closed = false;
  let remote = null;
  const close = () => {
    if (closed) return;
    closed = true;
    track.stop();
    pc.close();
  };
  try {
    pc.addTrack(track, microphone);
    pc.ontrack = (e) => {
      remote = e.streams[0] ?? new MediaStream([e.track]);
      audio.srcObject = remote;
      audio.play().catch(() => {}); // autoplay: the Connect click allows it
    };
    const channel = pc.createDataChannel("oai-events");
    channel.onmessage = (message) => onEvent(JSON.parse(message.data));
    const opened = new Promise((resolve, reject) => {
      channel.onopen = resolve;
      setTimeout(() => reject(new Error("WebRTC did not connect in time")), OPEN_TIMEOUT_MS);
    });
    await pc.setLocalDescription(await pc.createOffer());
    const headers = { "Content-Type": "application/sdp" };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const response = await fetch("/v1/realtime/calls", {
      method: "POST", body: pc.localDescription.sdp, headers,
    });
    if (response.status !== 201) {
      const why = (await response.json().catch(() => ({})))?.error?.message ?? response.status;
      throw new Error(`the server refused the call: ${why}`);
    }
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await opened;
    const ended = () => {
      if (!closed) onClose(`the call ended (${pc.connectionState})`);
      close();
    };
    channel.onclose = ended;
    pc.onconnectionstatechange = () => {
      if (["failed", "closed"].includes(pc.connectionState)) ended();
    };
    return {
      callId: response.headers.get("Location")?.split("/").pop() ?? null,
      send: (event) => channel.readyState === "open" && channel.send(JSON.stringify(event)),
      close,
      setMicrophone: (on) => (track.enabled = on), // off: the browser sends silence
      stats: () => inboundAudio(pc),
      recordReply: () => record(remote),
    };
  } catch (err) {
    close();
    throw err;
  }
}

// What the answer's track delivered (Chromium's inbound-rtp statistics).
async function inboundAudio(pc) {
  for (const report of (await pc.getStats()).values()) {
    if (report.type === "inbound-rtp" && report.kind === "audio") {
      return {
        packetsReceived: report.packetsReceived ?? 0,
        packetsLost: report.packetsLost ?? 0,
        totalAudioEnergy: report.totalAudioEnergy ?? 0,
        totalSamplesReceived: report.totalSamplesReceived ?? 0,
        concealedSamples: report.concealedSamples ?? 0,
        silentConcealedSamples: report.silentConcealedSamples ?? 0,
      };
    }
  }
  return null;
}

// Records the answer's track from now on: {stop()} resolves to base64 WebM/Opus (for
// tests and bug reports).
function record(stream) {
  if (!stream) throw new Error("no answer track yet");
  const recorder = new MediaRecorder(stream, { mimeType: "audio/webm;codecs=opus" });
  const chunks = [];
  recorder.ondataavailable = (e) => chunks.push(e.data);
  recorder.start();
  return {
    stop: () => new Promise((resolve, reject) => {
      recorder.onerror = (e) => reject(e.error);
      recorder.onstop = async () => {
        const bytes = new Uint8Array(await new Blob(chunks).arrayBuffer());
        let text = "";
        for (let i = 0; i < bytes.length; i += 0x8000) {
          text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        }
        resolve(btoa(text));
      };
      recorder.stop();
    }),
  };
}

// Reply playback for the voice chat page: PCM chunks at the session's output rate in,
// gapless sound out, and an instant stop for barge-in.
//
// createPlayer() picks the AudioWorklet player (playback-worklet.js: a ring buffer
// and a small jitter buffer on the audio thread). Only where the browser has no
// AudioWorklet (old browsers, or a page not served from a secure context, where
// browsers hide it) does it fall back to scheduling one AudioBufferSourceNode per chunk.
//
// Both players share one interface:
//   ensure()                 create/resume the AudioContext; call it inside a click
//   enqueue(samples, rateHz) queue mono Float32 samples recorded at rateHz
//   end()                    the reply's audio is complete: play out what is queued
//   stop()                   barge-in: silence now and forget everything queued
//   busy()                   whether anything is queued or playing
// and report through callbacks: onPlayed(seconds heard), onUnderrun(total so far),
// onChange() (busy() may have changed).

const DEFAULT_RATE_HZ = 24000; // the Realtime API's; a session may say otherwise
const JITTER_MS = 60; // the worklet starts a burst once this much audio is queued
const SCHEDULE_LEAD_S = 0.05; // the fallback's jitter buffer: a burst starts this far ahead

export function createPlayer(callbacks) {
  const hasWorklet = typeof AudioWorkletNode === "function" && "audioWorklet" in AudioContext.prototype;
  return hasWorklet ? new WorkletPlayer(callbacks) : new ScheduledPlayer(callbacks);
}

// ---------------------------------------------------------------- AudioWorklet

class WorkletPlayer {
  constructor({ onPlayed, onUnderrun = () => {}, onChange = () => {}, onError = () => {} }) {
    Object.assign(this, { onPlayed, onUnderrun, onChange, onError });
    this.kind = "worklet";
    this.ctx = null;
    this.node = null; // the AudioWorkletNode, once its module has loaded
    this.pending = []; // messages posted before the node existed, in order
    this.posted = 0; // frames posted to the worklet in all
    this.received = 0; // ... of which the worklet had received at its last report
    this.buffered = 0; // frames queued in the worklet at its last report
    this.underruns = 0;
  }

  // The context runs at the reply's rate (the browser converts to the device's), so
  // samples go to the worklet as they come; a new rate means a new context.
  ensure(rateHz = DEFAULT_RATE_HZ) {
    if (this.ctx && this.ctx.sampleRate !== rateHz) {
      this.ctx.close();
      Object.assign(this, { ctx: null, node: null, pending: [], posted: 0, received: 0, buffered: 0 });
    }
    if (!this.ctx) {
      this.ctx = new AudioContext({ sampleRate: rateHz });
      // addModule is asynchronous; enqueue() keeps messages in `pending` until it is done.
      this.ctx.audioWorklet
        .addModule("/static/playback-worklet.js")
        .then(() => this.attach())
        .catch((err) => this.onError(`audio playback: ${err.message}`));
    }
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  attach() {
    this.node = new AudioWorkletNode(this.ctx, "pcm-playback", {
      numberOfInputs: 0,
      outputChannelCount: [1], // mono; the destination up-mixes it to both speakers
      processorOptions: { startMs: JITTER_MS },
    });
    this.node.port.onmessage = (message) => this.onReport(message.data);
    this.node.connect(this.ctx.destination);
    for (const [data, transfer] of this.pending) this.node.port.postMessage(data, transfer);
    this.pending = [];
  }

  post(data, transfer = []) {
    if (this.node) this.node.port.postMessage(data, transfer);
    else this.pending.push([data, transfer]);
  }

  onReport({ played, underruns, buffered, received }) {
    this.buffered = buffered;
    this.received = received;
    if (played > 0) this.onPlayed(played / this.ctx.sampleRate);
    if (underruns !== this.underruns) this.onUnderrun((this.underruns = underruns));
    this.onChange();
  }

  // Frames the worklet holds plus frames posted that it has not received yet.
  busy() {
    return this.buffered + (this.posted - this.received) > 0;
  }

  enqueue(samples, rateHz) {
    this.ensure(rateHz);
    if (samples.length === 0) return;
    // A fresh copy, so its buffer can be transferred (moved, not copied) to the worklet.
    const chunk = samples.slice();
    this.posted += chunk.length;
    this.post(chunk, [chunk.buffer]);
  }

  end() {
    this.post({ type: "end" });
  }

  stop() {
    // Chunks not yet posted are simply dropped; the worklet drops what it holds and
    // reports at once (buffered 0, received = everything posted before the flush).
    for (const [data] of this.pending) {
      if (data instanceof Float32Array) this.posted -= data.length; // never to arrive
    }
    this.pending = this.pending.filter(([data]) => !(data instanceof Float32Array));
    if (this.ctx) this.post({ type: "flush" });
  }
}

// ---------------------------------------------------------------- fallback

// Each chunk becomes an AudioBuffer at the session's rate (WebAudio resamples it to the
// device's rate) and is scheduled to start exactly where the previous one ends, so the
// chunks join without gaps. After an underrun (or for the first chunk) playback restarts
// SCHEDULE_LEAD_S ahead of now, which gives the following chunks that long to arrive.
class ScheduledPlayer {
  constructor({ onPlayed, onUnderrun = () => {}, onChange = () => {} }) {
    Object.assign(this, { onPlayed, onUnderrun, onChange });
    this.kind = "scheduled";
    this.ctx = null;
    this.nextStartS = 0; // AudioContext time where the next chunk starts
    this.scheduled = new Map(); // AudioBufferSourceNode -> {startS, durationS}
    this.underruns = 0;
    this.midReply = false; // chunks of an unfinished reply have played
  }

  ensure() {
    this.ctx ??= new AudioContext();
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  busy() {
    return this.scheduled.size > 0;
  }

  enqueue(samples, rateHz) {
    const ctx = this.ensure();
    const buffer = ctx.createBuffer(1, samples.length, rateHz);
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    if (this.nextStartS < ctx.currentTime) {
      // The previous chunk already ended: a gap, unless this is a reply's first chunk.
      if (this.midReply) this.onUnderrun(++this.underruns);
      this.nextStartS = ctx.currentTime + SCHEDULE_LEAD_S;
    }
    this.midReply = true;
    source.start(this.nextStartS);
    this.scheduled.set(source, { startS: this.nextStartS, durationS: buffer.duration });
    this.nextStartS += buffer.duration;
    source.onended = () => {
      this.scheduled.delete(source);
      this.onPlayed(buffer.duration);
      this.onChange();
    };
  }

  end() {
    this.midReply = false;
  }

  // Barge-in: silence everything scheduled at once, counting only what was heard.
  stop() {
    this.midReply = false;
    if (!this.ctx) return;
    const now = this.ctx.currentTime;
    for (const [source, { startS, durationS }] of this.scheduled) {
      source.onended = null;
      source.stop();
      source.disconnect();
      this.onPlayed(Math.min(durationS, Math.max(0, now - startS)));
    }
    this.scheduled.clear();
    this.nextStartS = 0;
    this.onChange();
  }
}

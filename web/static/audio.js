// Audio for the voice chat page: gapless playback of PCM16 chunks, microphone capture
// to PCM16 at a fixed rate, and the PCM16 <-> base64 conversions of the Realtime API.

const PLAYBACK_LEAD_S = 0.05; // jitter buffer: a fresh burst of audio starts this far ahead

// ---------------------------------------------------------------- playback

// Each chunk becomes an AudioBuffer at the session's rate (WebAudio resamples it to the
// device's rate) and is scheduled to start exactly where the previous one ends, so the
// chunks join without gaps. After an underrun (or for the first chunk) playback restarts
// PLAYBACK_LEAD_S ahead of now, which gives the following chunks that long to arrive.
export class Player {
  constructor({ onPlayed }) {
    this.onPlayed = onPlayed; // called with seconds actually played (whole or cut chunks)
    this.ctx = null;
    this.nextStartS = 0; // AudioContext time where the next chunk starts
    this.scheduled = new Map(); // AudioBufferSourceNode -> {startS, durationS}
  }

  // Call from a user gesture (a click) first, so the autoplay policy lets it play.
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
    if (this.nextStartS < ctx.currentTime) this.nextStartS = ctx.currentTime + PLAYBACK_LEAD_S;
    source.start(this.nextStartS);
    this.scheduled.set(source, { startS: this.nextStartS, durationS: buffer.duration });
    this.nextStartS += buffer.duration;
    source.onended = () => {
      this.scheduled.delete(source);
      this.onPlayed(buffer.duration);
    };
  }

  // Barge-in: silence everything scheduled at once, counting only what was heard.
  stop() {
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
  }
}

// ---------------------------------------------------------------- capture

// Opens the microphone and calls onPcm(Int16Array) every intervalMs with what was
// captured since, as PCM16 mono at rateHz. close() stops it, sends the remainder and
// returns the number of samples delivered in all.
export async function openMicrophone({ rateHz, intervalMs, onPcm }) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  const ctx = new AudioContext();
  const resampler = new Resampler(ctx.sampleRate, rateHz);
  let pending = []; // Int16Array chunks not yet delivered
  let delivered = 0;
  const onSamples = (float32) => pending.push(floatToPcm16(resampler.push(float32)));
  const flush = () => {
    const pcm = concat(pending);
    pending = [];
    delivered += pcm.length;
    if (pcm.length > 0) onPcm(pcm);
  };

  let node;
  try {
    if (ctx.audioWorklet) {
      await ctx.audioWorklet.addModule("/static/capture-worklet.js");
      node = new AudioWorkletNode(ctx, "pcm-capture");
      node.port.onmessage = (message) => onSamples(message.data);
    } else {
      // Old browsers only: ScriptProcessorNode runs on the main thread.
      node = ctx.createScriptProcessor(2048, 1, 1);
      node.onaudioprocess = (e) => onSamples(new Float32Array(e.inputBuffer.getChannelData(0)));
    }
  } catch (err) {
    for (const track of stream.getTracks()) track.stop();
    ctx.close();
    throw err;
  }
  // Connected to the destination so the graph pulls it; its output is silence.
  ctx.createMediaStreamSource(stream).connect(node).connect(ctx.destination);
  const timer = setInterval(flush, intervalMs);

  return {
    close() {
      clearInterval(timer);
      node.disconnect();
      for (const track of stream.getTracks()) track.stop();
      ctx.close();
      flush();
      return delivered;
    },
  };
}

function concat(chunks) {
  const out = new Int16Array(chunks.reduce((n, chunk) => n + chunk.length, 0));
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.length;
  }
  return out;
}

// Streaming linear-interpolation resampler. Output sample k sits at input position
// k * step (step = fromHz / toHz). `pos` is the next output's position relative to the
// current chunk; index -1 is the previous chunk's last sample, so interpolation runs
// across chunk boundaries without clicks. (No low-pass filter before downsampling:
// fine for speech, which has little energy above 12 kHz.)
export class Resampler {
  constructor(fromHz, toHz) {
    this.step = fromHz / toHz;
    this.pos = 0;
    this.last = 0;
  }

  push(input) {
    const n = input.length;
    const out = new Float32Array(Math.ceil((n - this.pos) / this.step) + 1);
    let count = 0;
    while (Math.floor(this.pos) + 1 < n) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i < 0 ? this.last : input[i];
      out[count++] = a + (input[i + 1] - a) * frac;
      this.pos += this.step;
    }
    this.pos -= n; // now in [-1, step - 1): relative to the next chunk
    if (n > 0) this.last = input[n - 1];
    return out.subarray(0, count);
  }
}

// ---------------------------------------------------------------- PCM16 <-> base64

// Float [-1, 1] -> signed 16-bit; asymmetric scale so -1 maps to -32768 and 1 to 32767.
export function floatToPcm16(float32) {
  const pcm = new Int16Array(float32.length);
  for (let i = 0; i < float32.length; i++) {
    const s = Math.max(-1, Math.min(1, float32[i]));
    pcm[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  return pcm;
}

// PCM16 on the wire is little-endian; DataView makes that explicit on any platform.
export function pcm16ToBase64(pcm) {
  const bytes = new Uint8Array(pcm.length * 2);
  const view = new DataView(bytes.buffer);
  pcm.forEach((sample, i) => view.setInt16(2 * i, sample, true));
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function base64ToFloat32(b64) {
  const binary = atob(b64);
  const view = new DataView(new ArrayBuffer(binary.length));
  for (let i = 0; i < binary.length; i++) view.setUint8(i, binary.charCodeAt(i));
  const out = new Float32Array(binary.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
}

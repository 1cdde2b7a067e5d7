// Audio helpers for the voice chat page: microphone capture to PCM16 at a fixed rate,
// a streaming resampler, and the PCM16 <-> base64 conversions of the Realtime API.
// Reply playback lives in player.js (and playback-worklet.js).

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
// across chunk boundaries without clicks. E.g. 48 kHz -> 24 kHz: step 2, every other
// input sample; 16 kHz -> 48 kHz: step 1/3, two interpolated samples between inputs.
// (No low-pass filter before downsampling: fine for speech, which has little energy
// above 12 kHz; upsampling by interpolation leaves faint images above the old Nyquist.)
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

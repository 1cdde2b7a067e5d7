// Audio helpers for the voice chat page: microphone capture to PCM16 at a fixed rate
// and the PCM16 <-> base64 conversions of the Realtime API. No resampling here: the
// AudioContext is asked for the rate the server wants, and the browser converts
// the microphone to it (with its own anti-aliased resampler).
// Reply playback lives in player.js (and playback-worklet.js).

// ---------------------------------------------------------------- capture

// Opens the microphone and calls onPcm(Int16Array) every intervalMs with what was
// captured since, as PCM16 mono at rateHz. close() stops it, sends the remainder and
// returns the number of samples delivered in all.
export async function openMicrophone({ rateHz, intervalMs, onPcm }) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  const ctx = new AudioContext({ sampleRate: rateHz });
  let pending = []; // Int16Array chunks not yet delivered
  let delivered = 0;
  const onSamples = (float32) => pending.push(floatToPcm16(float32));
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

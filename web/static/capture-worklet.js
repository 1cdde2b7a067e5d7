// AudioWorklet module for microphone capture (loaded by app.js from /static).
// It runs on the audio thread and only copies samples out: the render quantum is
// 128 frames, far too small to post one message each, so it gathers ~20 ms and
// posts a Float32Array (mono, at the AudioContext's rate: the 24 kHz the server
// wants) to the main thread, which turns it into PCM16.

const BATCH_FRAMES = 512; // ~21 ms at 24 kHz

class PcmCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.batch = new Float32Array(BATCH_FRAMES);
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels && channels.length > 0) {
      const frames = channels[0].length;
      for (let i = 0; i < frames; i++) {
        // Down-mix to mono: the mean of all input channels.
        let sum = 0;
        for (const channel of channels) sum += channel[i];
        this.batch[this.filled++] = sum / channels.length;
        if (this.filled === BATCH_FRAMES) {
          this.port.postMessage(this.batch, [this.batch.buffer]);
          this.batch = new Float32Array(BATCH_FRAMES);
          this.filled = 0;
        }
      }
    }
    return true; // keep running until the node is disconnected
  }
}

registerProcessor("pcm-capture", PcmCapture);

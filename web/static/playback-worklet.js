// AudioWorklet module for reply playback (loaded by player.js from /static).
//
// The main thread posts mono Float32Array chunks that are already at this
// AudioContext's rate; they go into a ring buffer, and process() copies them out,
// one 128-frame render quantum at a time. Because the audio thread pulls samples
// at exactly the device's clock, consecutive chunks join without gaps.
//
// Jitter buffer: the network delivers chunks in bursts. A burst only starts playing
// once START_MS of audio is queued (or the main thread says the reply's audio is
// complete, "end"), so that small delays between chunks are absorbed. If the
// buffer runs dry mid-reply (an underrun) the node outputs silence, counts it and
// waits for START_MS again before resuming, rather than stuttering sample by sample.
//
// Messages in:  Float32Array            samples to queue
//               {type: "end"}           no more audio for now: play out what is queued
//               {type: "flush"}         barge-in: drop everything queued, at once
// Messages out: {played, underruns, buffered, received, playing}
//   played:   frames actually played since the previous report (silence not counted)
//   underruns: total so far; buffered: frames queued now;
//   received: total frames ever received (lets the main thread tell what is in flight)

const START_MS = 60; // jitter threshold before a burst starts
const REPORT_MS = 50; // report played frames at least this often while playing
const INITIAL_SECONDS = 10; // ring capacity to begin with; it doubles when full

class PcmPlayback extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const startMs = options?.processorOptions?.startMs ?? START_MS;
    // `sampleRate` is a global of the AudioWorkletGlobalScope: the context's rate.
    this.startFrames = Math.round((sampleRate * startMs) / 1000);
    this.reportFrames = Math.round((sampleRate * REPORT_MS) / 1000);
    this.ring = new Float32Array(sampleRate * INITIAL_SECONDS);
    this.read = 0; // index of the next frame to play
    this.size = 0; // frames queued; the write index is (read + size) % ring.length
    this.playing = false; // false: priming (silent) until the jitter threshold is met
    this.ended = false; // the main thread sent "end": play out without waiting
    this.underruns = 0;
    this.received = 0;
    this.unreported = 0; // frames played since the last report
    this.port.onmessage = (message) => this.onMessage(message.data);
  }

  onMessage(data) {
    if (data instanceof Float32Array) {
      this.push(data);
      this.ended = false; // more audio came: this is a reply in progress
    } else if (data.type === "end") {
      this.ended = true;
    } else if (data.type === "flush") {
      this.read = 0;
      this.size = 0;
      this.playing = false;
      this.ended = false;
      this.report(); // at once, so the page sees the buffer empty
    }
  }

  push(samples) {
    this.received += samples.length;
    if (this.size + samples.length > this.ring.length) this.grow(this.size + samples.length);
    // Copy in at most two runs: up to the end of the ring, then from its start.
    const capacity = this.ring.length;
    const write = (this.read + this.size) % capacity;
    const first = Math.min(samples.length, capacity - write);
    this.ring.set(samples.subarray(0, first), write);
    this.ring.set(samples.subarray(first), 0);
    this.size += samples.length;
  }

  // Rare (a reply far longer than the ring), and outside process(): allocate a larger
  // ring and unwrap the queued frames to its start.
  grow(needed) {
    let capacity = this.ring.length * 2;
    while (capacity < needed) capacity *= 2;
    const ring = new Float32Array(capacity);
    const first = Math.min(this.size, this.ring.length - this.read);
    ring.set(this.ring.subarray(this.read, this.read + first), 0);
    ring.set(this.ring.subarray(0, this.size - first), first);
    this.ring = ring;
    this.read = 0;
  }

  report() {
    this.port.postMessage({
      played: this.unreported,
      underruns: this.underruns,
      buffered: this.size,
      received: this.received,
      playing: this.playing,
    });
    this.unreported = 0;
  }

  process(inputs, outputs) {
    const out = outputs[0][0]; // mono; the node's single output channel
    if (!out) return true;
    const frames = out.length; // 128 today, but the spec lets it vary
    if (!this.playing && this.size > 0 && (this.size >= this.startFrames || this.ended)) {
      this.playing = true;
      this.report(); // a burst starts: tell the page promptly
    }
    let n = 0; // frames copied from the ring into this quantum
    if (this.playing) {
      n = Math.min(frames, this.size);
      const capacity = this.ring.length;
      const first = Math.min(n, capacity - this.read);
      out.set(this.ring.subarray(this.read, this.read + first), 0);
      out.set(this.ring.subarray(0, n - first), first);
      this.read = (this.read + n) % capacity;
      this.size -= n;
      this.unreported += n;
      if (this.size === 0) {
        // Dry. If the reply's audio is complete this is its natural end; otherwise the
        // next chunk is late: an underrun. Either way wait for the threshold again.
        if (!this.ended) this.underruns++;
        this.playing = false;
        this.ended = false;
        this.report();
      } else if (this.unreported >= this.reportFrames) {
        this.report();
      }
    }
    out.fill(0, n); // silence for whatever the buffer could not fill
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out); // mono to all
    return true; // keep the node alive for the whole session
  }
}

registerProcessor("pcm-playback", PcmPlayback);

"""Measure the CPU cost and size of encoding video frames to MP4 (libx264/libx265 per preset) on this machine.

An explicit measurement command (``pip install av`` first; PyAV bundles FFmpeg's libx264 and libx265),
not part of the tests: it writes one JSON row per (resolution, codec, preset, threads) and the
catalog's ``video_codecs.yaml`` quotes the committed result (benchmarks/data/video_encode_<date>.json).
The frames are a smooth multi-scale texture panned 2 px a frame, a stand-in for generated video
that compresses better than real footage (so its sizes are a lower bound).

    python benchmarks/video_encode.py > benchmarks/data/video_encode_$(date +%F).json
"""

from __future__ import annotations

import io
import json
import os
import time

import numpy as np

SIZES = ((832, 480), (1280, 720), (1920, 1080))
CODECS = (("libx264", 23, ("ultrafast", "veryfast", "medium", "slow")), ("libx265", 28, ("ultrafast", "medium")))


def frames_of(w: int, h: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` RGB frames of a smooth texture (four octaves of blurred noise) panned 2 px a frame."""
    W, H = w + 2 * n + 64, h + 64
    base = np.zeros((H, W, 3), np.float32)
    for scale, amp in ((64, 0.5), (16, 0.3), (4, 0.15), (1, 0.05)):
        small = rng.random((H // scale + 2, W // scale + 2, 3)).astype(np.float32)
        up = np.repeat(np.repeat(small, scale, 0), scale, 1)[:H, :W]
        if scale > 1:  # box blur through a summed-area table
            c = np.cumsum(np.cumsum(up, 0), 1)
            up = (c[scale:, scale:] - c[:-scale, scale:] - c[scale:, :-scale] + c[:-scale, :-scale]) / scale ** 2
            up = np.pad(up, ((0, scale), (0, scale), (0, 0)), mode="edge")
        base += amp * up[:H, :W]
    base = (base - base.min()) / (base.max() - base.min())
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        out[i] = np.clip(base[16:16 + h, 2 * i:2 * i + w] * (0.9 + 0.1 * np.sin(i / 10)) * 255, 0, 255)
    return out


def encode(frames: np.ndarray, codec: str, preset: str, threads: int, crf: int) -> tuple[float, float, int]:
    """(wall s, process CPU s, bytes) of one in-memory MP4 encode."""
    import av

    buf = io.BytesIO()
    box = av.open(buf, mode="w", format="mp4")
    s = box.add_stream(codec, rate=16)
    s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    opts = {"crf": str(crf), "preset": preset}
    if codec == "libx264":
        opts["threads"] = str(threads)
    else:
        opts["x265-params"] = f"pools={threads or '*'}:log-level=error"
    s.options = opts
    t0, c0 = time.perf_counter(), time.process_time()
    for f in frames:
        for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
            box.mux(p)
    for p in s.encode():
        box.mux(p)
    box.close()
    return time.perf_counter() - t0, time.process_time() - c0, len(buf.getvalue())


def main() -> None:
    n = int(os.environ.get("NF", 81))
    rng = np.random.default_rng(0)
    rows = []
    for w, h in SIZES:
        fr = frames_of(w, h, n, rng)
        for codec, crf, presets in CODECS:
            for preset in presets:
                for threads in (1, 0):
                    wall, cpu, size = encode(fr, codec, preset, threads, crf)
                    px = w * h * n
                    rows.append({"res": f"{w}x{h}", "frames": n, "codec": codec, "crf": crf, "preset": preset,
                                 "threads": threads or "auto", "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                                 "cpu_ns_per_px": round(cpu / px * 1e9, 2), "bytes": size,
                                 "bpp": round(8 * size / px, 4)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Video DiTs: 3-D tokens, the temporal VAE's structure, MP4 delivery, and their errors, against closed forms."""

from __future__ import annotations

import pytest

from simulator.api import simulate
from simulator.config import catalog
from simulator.config.dit_arch import DiTArch
from simulator.config.dit_models import encode_threads, video_codecs
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.pipelines.dit import CATEGORIES, DiTModel
from simulator.pipelines.dit.sim import Pass
from simulator.workloads import dit as W


def arch(name: str) -> DiTArch:
    return DiTArch.from_dict(catalog.entry("dits", name), name)


def wan(**kw):
    raw = {"kind": "dit", "model": "wan2.1-t2v-1.3b", "resolution": "832x480", "frames": 81, "steps": 2,
           "delivery": {"vae": True, "format": "mp4"}, "workload": {"requests": 1, "arrival": "closed", "concurrency": 1},
           "hardware": {"gpu": "h100-sxm"}}
    raw.update(kw)
    return load_scenario(raw)


@pytest.mark.parametrize("model, size, frames, tokens", [
    ("wan2.1-t2v-1.3b", (480, 832), 81, 21 * 30 * 52),      # 32,760: SGLang PR #36494's attention shape
    ("wan2.1-t2v-14b", (720, 1280), 81, 21 * 45 * 80),      # 75,600
    ("hunyuan-video", (720, 1280), 129, 33 * 45 * 80),      # 118,800
])
def test_video_tokens_are_latent_frames_times_patches(model, size, frames, tokens):
    a = arch(model)
    assert a.latent_frames(frames) == 1 + (frames - 1) // 4
    assert W.image_tokens(a, *size, frames) == tokens


def test_the_temporal_vae_doubles_frames_where_marked_and_decodes_every_output_frame():
    vae = arch("wan2.1-t2v-1.3b").vae
    ops = {op.name: op for op in W.vae_decode_ops(480, 832, "bf16", 1, vae, 81)}
    lat = 60 * 104  # latent pixels per frame
    assert ops["conv_in"].gemm[0] == 21 * lat                 # the 21 latent frames
    assert ops["up1.res0.conv1"].gemm[0] == 41 * lat * 4      # after one temporal upsample, at 2x
    assert ops["conv_out"].gemm[0] == 81 * 480 * 832          # every output frame at full size
    # a causal 3x3x3 convolution reduces over three frames: k = cin x 27
    assert ops["conv_in"].gemm[2] == 16 * 27
    # the first chunk's cache is twice its one latent frame: the concatenation moves three frames' worth
    cat = ops["conv_in.cache_cat"]
    assert cat.bytes == pytest.approx(2 * 21 * lat * 16 * (1 + 2) * 2)


def test_an_image_vae_is_unchanged_by_the_video_terms():
    a = arch("pixart-alpha")
    assert W.vae_decode_ops(1024, 1024, "bf16", 1, a.vae) == W.vae_decode_ops(1024, 1024, "bf16", 1, a.vae, None)
    assert not any("cache_cat" in op.name for op in W.vae_decode_ops(1024, 1024, "bf16", 1, a.vae))


def test_mp4_encode_is_pixels_times_the_presets_cost_over_its_threads():
    sc = wan(delivery={"vae": True, "format": "mp4", "preset": "veryfast"})
    ps = Pass.build(DiTModel.build(sc))
    d2h, ipc, enc, out = ps.output
    px = 832 * 480 * 81
    p = video_codecs()["h264"].presets["veryfast"]
    cores = sc.hardware.cpu_cores
    assert enc == pytest.approx(px * p.seconds_per_pixel / min(cores, encode_threads(cores, 480), p.max_speedup))
    assert out == pytest.approx(px * video_codecs()["h264"].bits_per_pixel / 8 * p.size_factor + 200.0)
    assert d2h == px * 3 * 2  # the decoded bf16 frames


def test_x264_threads_follow_its_automatic_count():
    assert encode_threads(8, 720) == 12       # 1.5 per CPU
    assert encode_threads(64, 480) == 15      # at most one per two macroblock rows: (480 + 15) // 16 // 2
    assert encode_threads(64, 1080) == 34


def test_a_wan_run_books_its_last_mile_and_sums_exactly():
    res = simulate(wan(parallel={"ulysses": 2}))
    row = res.breakdown.iloc[0]
    assert row["encode"] > 0 and row["vae"] > 0 and row["comm"] > 0
    assert sum(row[c] for c in CATEGORIES) == pytest.approx(row["latency_s"], rel=1e-12)
    assert res.summary["frames"] == 81 and res.requests["frames"].iloc[0] == 81


def test_the_video_vae_workspace_holds_one_chunk_and_its_cache():
    m = DiTModel.build(wan())
    assert m._vae_workspace() == pytest.approx(3 * (4 + 2) * 480 * 832 * 96 * 2)


def test_flash3_runs_faster_on_hopper_and_is_refused_elsewhere():
    t2 = simulate(wan(kernels={"attention": "flash2"})).summary["breakdown_mean_s"]["denoise"]
    t3 = simulate(wan(kernels={"attention": "flash3"})).summary["breakdown_mean_s"]["denoise"]
    assert t3 < t2
    with pytest.raises(ConfigError) as exc:
        wan(kernels={"attention": "flash3"}, hardware={"gpu": "a100-sxm-80g"})
    assert exc.value.path == "kernels.attention"


@pytest.mark.parametrize("override, path, words", [
    ({"frames": 80}, "frames", "1 + k x 4"),
    ({"frames": None}, "frames", "makes video"),
    ({"delivery": {"vae": True, "format": "png"}}, "delivery.format", "makes video"),
    ({"delivery": {"vae": True, "format": "mp4", "preset": "medum"}}, "delivery.preset", "did you mean 'medium'"),
    ({"delivery": {"vae": True, "format": "raw", "preset": "fast"}}, "delivery.preset", "mp4 only"),
    ({"model": "pixart-alpha", "resolution": 512}, "frames", "makes images"),
    ({"model": "pixart-alpha", "resolution": 512, "frames": None}, "delivery.format", "makes images"),
])
def test_bad_video_settings_name_their_key(override, path, words):
    with pytest.raises(ConfigError) as exc:
        wan(**override)
    assert exc.value.path == path and words in exc.value.message


def test_each_ipc_hop_pickles_and_unpickles_the_float32_frames_into_the_last_mile():
    from simulator.pipelines.dit.sim import PICKLE_IPC_RATE

    base = simulate(wan()).breakdown.iloc[0]
    two = simulate(wan(delivery={"vae": True, "format": "mp4", "ipc_hops": 2})).breakdown.iloc[0]
    px = 832 * 480 * 81
    assert base["ipc"] == 0.0
    assert two["ipc"] == pytest.approx(2 * 2 * px * 3 * 4 / PICKLE_IPC_RATE, rel=1e-12)
    assert two["latency_s"] - base["latency_s"] == pytest.approx(two["ipc"], rel=1e-9)


def test_the_hopper_attention_fraction_is_read_at_the_padded_head_dimension():
    from simulator.pipelines.dit_cost import attention_fraction

    assert attention_fraction("hopper", "flash2", 64) == 0.328
    assert attention_fraction("hopper", "flash2", 96) == 0.374     # PixArt's 72, padded to 96, reads the 128 figure
    assert attention_fraction("hopper", "flash3", 512) == 0.649    # beyond the table: its largest head dimension
    assert attention_fraction("ampere", "flash2", 128) is None     # the GEMM + FP32-softmax model holds there

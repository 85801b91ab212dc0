"""DiT cost model against the reference FLOP counts, plus scaling, splitting and byte checks."""

from __future__ import annotations

import importlib.resources

import pytest
import yaml

from simulator.workloads import dit
from simulator.workloads.dit import DiTArch, VAEArch, total_bytes, total_flops

CATALOG = yaml.safe_load(
    (importlib.resources.files("simulator.config") / "catalog" / "dits.yaml").read_text())
DITS = [n for n, e in CATALOG.items() if e.get("kind") == "dit"]


def arch(name: str) -> DiTArch:
    return DiTArch.from_dict(CATALOG[name], name)


def within(x: float, ref: float, tol: float) -> bool:
    return abs(x / ref - 1) <= tol


# ---- catalog -------------------------------------------------------------------------------

def test_catalog_has_the_image_and_video_models():
    assert set(DITS) == {"pixart-alpha", "pixart-sigma", "sd3-medium", "flux-1-dev", "dit-xl-2",
                         "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "hunyuan-video"}


@pytest.mark.parametrize("name", list(CATALOG))
def test_every_figure_has_a_source(name):
    entry = CATALOG[name]
    covered = set(entry["sources"])
    if "shape" in covered:  # one citation for the whole shape (as in llms.yaml)
        covered |= {"layers", "hidden", "heads", "head_dim", "kv_heads", "ffn", "ffn_kind", "vocab"}
    missing = [k for k in entry if k not in ("name", "kind", "sources") and k not in covered]
    assert not missing, f"{name}: no source for {missing}"


@pytest.mark.parametrize("name", DITS)
def test_params_from_shapes_match_catalog(name):
    a = arch(name)
    assert within(dit.param_count(a), a.params, 0.05)
    for enc in a.text_encoders:
        assert within(dit.text_encoder_params(enc), enc.params, 0.02)


def test_flux_layers_and_kinds():
    a = arch("flux-1-dev")
    assert a.num_layers == 57
    assert a.layer_kind(18) == "joint" and a.layer_kind(19) == "single"
    with pytest.raises(ValueError):
        a.layer_kind(57)


@pytest.mark.parametrize("field", ["hidden", "heads", "text_mode", "params", "patch_size"])
def test_from_dict_rejects_missing_fields(field):
    d = dict(CATALOG["pixart-sigma"])
    del d[field]
    with pytest.raises(ValueError, match=field):
        DiTArch.from_dict(d, "broken")


def test_from_dict_rejects_bad_values():
    for key, bad in [("text_mode", "sideways"), ("heads", 0), ("hidden", "wide"), ("qk_norm", "yes")]:
        with pytest.raises(ValueError, match=key):
            DiTArch.from_dict({**CATALOG["sd3-medium"], key: bad}, "broken")
    with pytest.raises(ValueError, match="kind"):
        DiTArch.from_dict(CATALOG["sd-vae"], "sd-vae")


# ---- FLOPs against the reference (torch FLOP counter, transformer forward only) ----------

@pytest.mark.parametrize("name,res,ref_tflop", [
    ("pixart-sigma", 1024, 6.63), ("pixart-sigma", 2048, 52.37),
    ("sd3-medium", 1024, 8.90), ("sd3-medium", 2048, 63.92),
    ("flux-1-dev", 1024, 74.38), ("flux-1-dev", 2048, 418.11),
])
def test_forward_flops_match_reference(name, res, ref_tflop):
    assert within(dit.forward_flops(arch(name), res, res), ref_tflop * 1e12, 0.10)


def test_dit_xl2_matches_paper():
    # DiT paper Table 4: 118.6 GFLOPs (multiply-adds) at 256^2 -> 237.2 GFLOP
    assert within(dit.forward_flops(arch("dit-xl-2"), 256, 256), 237.2e9, 0.10)


@pytest.mark.parametrize("res,ref_tflop", [(512, 2.515), (1024, 10.47), (2048, 48.48)])
def test_vae_decode_flops_match_reference(res, ref_tflop):
    assert within(dit.vae_decode_flops(res, res), ref_tflop * 1e12, 0.10)


def test_vae_decoder_params_fit_inside_the_vae():
    for key in ("sd-vae", "sd3-vae"):
        vae = VAEArch.from_dict(CATALOG[key])
        assert 0.5 * vae.params < dit.vae_decoder_params(vae) < 0.65 * vae.params


def test_wan_vae_decoder_halves_channels_at_each_upsample():
    # Wan2.1 vae.py Resample: Conv2d(dim, dim // 2); the decoder's 73.3 M parameters (dits.yaml) count it
    wan = VAEArch.from_dict(CATALOG["wan-vae"])
    assert within(dit.vae_decoder_params(wan), 73.3e6, 0.002)
    assert dit.vae_decoder_params(wan.model_copy(update={"upsample_halves": False})) > 77e6


def _wan_ops(channels_last=False, eager=True, frames=17):
    from simulator.pipelines.dit_cost import vae_eager
    wan = VAEArch.from_dict(CATALOG["wan-vae"])
    return dit.vae_decode_ops(384, 640, "bf16", 1, wan, frames, vae_eager(wan, channels_last) if eager else None)


def test_wan_vae_eager_norms_are_the_census_passes():
    # RMS_norm + SiLU: norm read, division, * scale, * gamma, + bias, SiLU = 11 passes, against one fused each way
    eager = {op.name: op for op in _wan_ops() if op.name.endswith("norm_silu")}
    fused = {op.name: op for op in _wan_ops(eager=False) if op.name.endswith("norm_silu")}
    assert eager.keys() == fused.keys() and eager
    for name, op in eager.items():
        assert op.bytes == pytest.approx(fused[name].bytes * 11 / 2)


def test_wan_vae_cached_conv_census_at_the_top_level():
    # up3 (96 channels at 384 x 640, 4 frames a call past the first latent frame): a cached 3x3x3 conv's input of
    # x elements costs the cache's concatenation (1.5x read and written), the clone of 2 of 4 frames (read, write),
    # F.pad's fill and copy (3 passes of 1.5x) and, channels_last, the relayout (2 passes of 1.5x)
    ops = {op.name: op for op in _wan_ops(channels_last=True)}
    x = 17 * 384 * 640 * 96  # the top level's elements over the whole video: 17 frames
    assert ops["up3.res1.conv1.cache_cat"].bytes == pytest.approx(2 * 1.5 * x * 2)
    assert ops["up3.res1.conv1.cache_clone"].bytes == pytest.approx(2 * 0.5 * x * 2)
    assert ops["up3.res1.conv1.pad"].bytes == pytest.approx(3 * 1.5 * x * 2)
    assert ops["up3.res1.conv1.relayout"].bytes == pytest.approx(2 * 1.5 * x * 2)
    assert ops["up3.res1.conv1.bias"].bandwidth_share == pytest.approx(0.374)
    ncdhw = {op.name: op for op in _wan_ops(channels_last=False)}
    assert "up3.res1.conv1.relayout" not in ncdhw and ncdhw["up3.res1.conv1.bias"].bandwidth_share == 1.0


# ---- tokens and scaling --------------------------------------------------------------------

@pytest.mark.parametrize("name", DITS)
def test_image_tokens(name):
    assert dit.image_tokens(arch(name), 1024, 1024) == 4096
    assert dit.image_tokens(arch(name), 2048, 1024) == 8192
    with pytest.raises(ValueError):
        dit.image_tokens(arch(name), 1000, 1024)


def _by_name(ops):
    return {op.name: op for op in ops}


def test_attention_quadratic_linear_parts_linear():
    a = arch("pixart-sigma")
    small, big = _by_name(dit.block_ops(a, 4096, 4096)), _by_name(dit.block_ops(a, 8192, 8192))
    assert big["self_attn"].flops == pytest.approx(4 * small["self_attn"].flops)
    for name in ("qkv", "attn_out", "mlp_in", "mlp_out", "cross_q", "cross_attn"):
        assert big[name].flops == pytest.approx(2 * small[name].flops)
    assert big["cross_kv"].flops == small["cross_kv"].flops  # text side: independent of image


def test_patch_attending_to_stale_kv():
    a = arch("sd3-medium")
    full, patch = _by_name(dit.block_ops(a, 4096, 4096)), _by_name(dit.block_ops(a, 1024, 4096))
    assert patch["img_qkv"].flops == pytest.approx(full["img_qkv"].flops / 4)
    T = a.text_tokens
    ratio = (1024 + T) / (4096 + T)  # queries shrink, keys (image + text) stay
    assert patch["joint_attn"].flops == pytest.approx(full["joint_attn"].flops * ratio)
    assert patch["joint_attn"].bytes > full["joint_attn"].bytes * ratio  # K/V still read in full
    with pytest.raises(ValueError):
        dit.block_ops(a, 4096, 1024)


def test_text_stream_off_drops_text_work_but_keeps_text_keys():
    a = arch("flux-1-dev")
    on = dit.block_ops(a, 1024, 4096, kind="joint")
    off = _by_name(dit.block_ops(a, 1024, 4096, kind="joint", text_stream=False))
    assert not any(n.startswith("txt_") for n in off)
    assert off["joint_attn"].flops == pytest.approx(4 * a.heads * 1024 * (4096 + 512) * a.head_dim)
    assert total_flops(off.values()) < total_flops(on)


@pytest.mark.parametrize("name", DITS)
def test_tp_divides_per_gpu_work(name):
    a = arch(name)
    s = 4096
    one = dit.model_ops(a, s, s)
    two = dit.model_ops(a, s, s, tp=2)
    assert within(total_flops(two), total_flops(one) / 2, 0.01)  # adaLN, norms replicated
    split = ("qkv", "attn_out", "mlp_in", "mlp_out", "self_attn", "joint_attn", "cross_attn")
    one_n, two_n = _by_name(one), _by_name(two)
    for n in one_n:
        if n.split("_", 1)[-1] in split or n in split:
            assert two_n[n].flops == pytest.approx(one_n[n].flops / 2), n
    with pytest.raises(ValueError, match="tp"):
        dit.block_ops(a, s, s, tp=5, kind=a.layer_kind(0))


def test_stages_partition_the_model():
    a = arch("flux-1-dev")
    whole = total_flops(dit.model_ops(a, 4096))
    cuts = [0, 10, 19, 30, 57]
    parts = [dit.stage_ops(a, lo, hi, 4096, 4096) for lo, hi in zip(cuts, cuts[1:])]
    assert sum(total_flops(p) for p in parts) == pytest.approx(whole)
    assert "patch_embed" in _by_name(parts[0]) and "patch_embed" not in _by_name(parts[1])
    assert "final_proj" in _by_name(parts[-1])
    assert _by_name(parts[0])["img_qkv"].count == 10  # ten identical double blocks, folded


def test_sd3_last_block_has_no_text_mlp():
    a = arch("sd3-medium")
    last = _by_name(dit.layer_ops(a, 23, 4096, 4096))
    assert "txt_qkv" in last and "txt_mlp_in" not in last and "txt_attn_out" not in last
    assert "txt_mlp_in" in _by_name(dit.layer_ops(a, 22, 4096, 4096))


# ---- bytes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DITS)
def test_bytes_positive_and_weights_once_per_op(name):
    a = arch(name)
    one = dit.model_ops(a, 256, 256, batch=1)
    two = dit.model_ops(a, 256, 256, batch=2)
    assert all(op.bytes > 0 and op.flops >= 0 for op in one)
    for o1, o2 in zip(one, two):
        assert o1.name == o2.name
        if o1.gemm:
            m, n, k = o1.gemm
            # doubling the batch doubles activations only; the weight term appears once
            assert 2 * o1.bytes - o2.bytes == pytest.approx(k * n * 2)
            assert o1.flops == 2 * m * n * k


def test_fp8_halves_weight_bytes():
    a = arch("flux-1-dev")
    b16 = _by_name(dit.block_ops(a, 1, 1, kind="single"))["proj_out"]
    f8 = _by_name(dit.block_ops(a, 1, 1, kind="single", dtype="fp8"))["proj_out"]
    _, n, k = b16.gemm
    assert b16.bytes - f8.bytes == pytest.approx(k * n)
    assert f8.dtype == "fp8"


def test_memory_helpers():
    a = arch("flux-1-dev")
    assert dit.dit_memory(a, "bf16") == pytest.approx(2 * 11.9e9)
    assert dit.dit_memory(a, "bf16", text_encoders=True, vae=True) > dit.dit_memory(a, "bf16") + 9e9
    assert dit.activation_bytes(a, 4096, 2) == 2 * 4096 * 3072 * 2
    assert dit.kv_bytes(a, 4096, 57) == 2 * 4096 * 3072 * 57 * 2
    assert dit.kv_bytes(a, 4096, 57, tp=2) == dit.kv_bytes(a, 4096, 57) / 2
    assert dit.peak_activation_bytes(a, 4096) > dit.activation_bytes(a, 4096)


def test_text_encoder_ops():
    a = arch("pixart-sigma")
    ops = dit.text_encoder_ops(a, batch=2)
    t5 = a.text_encoders[0]
    dense = t5.params - t5.vocab * t5.hidden  # every non-embedding weight sees every token
    assert within(total_flops(ops), 2 * 2 * 300 * dense, 0.05)
    assert total_bytes(ops) > dense * 2  # weights read at least once
    assert dit.text_encoder_ops(arch("dit-xl-2")) == []
    assert len(arch("sd3-medium").text_encoders) == 3


# ---- DiT-side kernel census and NCCL figures (simulator/pipelines/dit_cost.py) --------------

def test_allreduce_uses_measured_nccl_busbw_on_nvlink3_only():
    from simulator.config.loader import load_scenario

    links = load_scenario({"hardware": {"gpu": "a100-sxm-80g"}}).hardware
    assert links.gpu_link.allreduce_bandwidth == pytest.approx(205e9)
    h100 = load_scenario({"hardware": {"gpu": "h100-sxm"}}).hardware
    assert h100.gpu_link.allreduce_bandwidth == pytest.approx(h100.gpu_link.effective_bandwidth)
    slow = load_scenario({"hardware": {"gpu": "a100-sxm-80g", "gpu_link": {"base": "nvlink3", "bandwidth": "100 GB/s"}}})
    assert slow.hardware.gpu_link.allreduce_bandwidth == pytest.approx(88e9)  # never faster than the link

def test_unfused_elementwise_census_per_block_kind_and_eager_code():
    from simulator.pipelines.dit_cost import unfused

    assert unfused("extra_passes_per_block", "cross") == 16
    assert unfused("extra_passes_per_block", "self") == 14
    assert unfused("extra_passes_per_block", "joint") == 14
    assert unfused("extra_passes_per_block", "single") == 8
    assert unfused("tp_bias_passes_per_split_module") == 2
    assert unfused("rope_passes", "diffusers") == 48 and unfused("qk_norm_passes", "wan") == 32


def test_the_fp32_rotary_and_qk_norm_passes_cost_their_bytes_per_layer_split_by_tp():
    """A step's unfused element-wise op grows by (rope + qk-norm passes) x layers x b·q·hidden bytes, over tp."""
    from simulator.pipelines.dit.model import _qk_passes

    a = arch("flux-1-dev")
    assert _qk_passes(a, 57, 1) == 57 * (48 + 30)
    assert _qk_passes(a, 57, 4) == 57 * (48 + 30) / 4
    plain = a.model_copy(update={"rope": False, "qk_norm": False})
    assert _qk_passes(plain, 57, 1) == 0
    assert _qk_passes(arch("wan2.1-t2v-14b"), 40, 1) == 40 * (56 + 32)

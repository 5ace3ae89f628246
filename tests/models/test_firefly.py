"""Parity and loading tests for the Firefly decoder/encoder (spec §4; fixtures "tiny_decoder").

Measured on CPU fp32 (torch 2.13): waveform max |diff| ~3e-8, quantizer_decode_z 0, log-mel and
every encoder intermediate 0, codes identical. bf16 weights: waveform max |diff| ~9e-4 (peak 0.1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fishserve.models.firefly import (
    FireflyConfig,
    FireflyGenerator,
    build_dummy_firefly,
    checkpoint_param_count,
    expected_checkpoint_shapes,
    fold_weight_norm,
    load_firefly,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "tiny_decoder"
FULL = FIXTURES / "full_config"
PARITY_TOL = 1e-4  # fixtures README "Tolerances"; we measure ~3e-8
BF16_TOL = 5e-3  # bf16 weights, waveform peak ~0.1; we measure ~9e-4


@pytest.fixture(scope="module")
def tiny_config() -> FireflyConfig:
    return FireflyConfig.from_file(TINY / "firefly_gan_vq_tiny.yaml")


@pytest.fixture(scope="module")
def tiny_model(tiny_config: FireflyConfig) -> FireflyGenerator:
    return load_firefly(TINY / "generator.pth", tiny_config)


@pytest.fixture(scope="module")
def decode_case() -> dict[str, torch.Tensor]:
    return load_file(str(TINY / "decode_case.safetensors"))


@pytest.fixture(scope="module")
def encode_case() -> dict[str, torch.Tensor]:
    return load_file(str(TINY / "encode_case.safetensors"))


@pytest.fixture(scope="module")
def raw_state_dict() -> dict[str, torch.Tensor]:
    return torch.load(TINY / "generator.pth", map_location="cpu", weights_only=True)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# ---------------------------------------------------------------------------- config
def test_tiny_config_yaml_equals_json(tiny_config: FireflyConfig) -> None:
    assert FireflyConfig.from_file(TINY / "config.json") == tiny_config
    assert tiny_config.frame_samples == 256
    assert tiny_config.sample_rate == 44100
    assert tiny_config.n_groups == 4
    assert tiny_config.codebook_size == 1000


def test_released_config_matches_reference_json() -> None:
    cfg = FireflyConfig.released()
    assert FireflyConfig.from_file(FULL / "decoder_firefly_gan_vq_config.json") == cfg
    reference = json.loads((FULL / "decoder_firefly_gan_vq_config.json").read_text())
    ours = cfg.to_dict()
    for section, values in reference.items():
        if section == "_target_":
            continue
        for key, value in values.items():
            if key != "_target_":
                assert ours[section][key] == value, (section, key)
    assert (cfg.frame_samples, cfg.sample_rate, cfg.n_groups) == (2048, 44100, 8)


@pytest.mark.parametrize(
    "patch",
    [{"extra": {}}, {"head": {"bogus_key": 1}}, {"quantizer": {"n_codebooks": 2}}],
)
def test_config_rejects_bad_keys(patch: dict) -> None:
    data = json.loads((TINY / "config.json").read_text())
    for section, values in patch.items():
        if section in data:
            data[section].update(values)
        else:
            data[section] = values
    with pytest.raises(ValueError):
        FireflyConfig.from_dict(data)


# ---------------------------------------------------------------------------- decode
def test_quantizer_decode_z(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    with torch.inference_mode():
        z = tiny_model.decode_latent(decode_case["codes"])
    assert z.shape == decode_case["quantizer_decode_z"].shape
    assert max_diff(z, decode_case["quantizer_decode_z"]) < PARITY_TOL


def test_decode_single(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    wav, lengths = tiny_model.decode(decode_case["codes"], decode_case["feature_lengths"])
    assert wav.shape == decode_case["waveform"].shape and wav.dtype == torch.float32
    assert torch.equal(lengths, decode_case["audio_lengths"])
    assert max_diff(wav, decode_case["waveform"]) < PARITY_TOL


def test_decode_batch_with_masking(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    wav, lengths = tiny_model.decode(
        decode_case["codes_batch"], decode_case["feature_lengths_batch"]
    )
    assert torch.equal(lengths, decode_case["audio_lengths_batch"])
    assert max_diff(wav, decode_case["waveform_batch"]) < PARITY_TOL
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(wav[b, :, n:] == 0)
        assert wav[b, :, :n].abs().max() > 0


def test_decode_is_causal(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    codes = decode_case["codes"]
    full, _ = tiny_model.decode(codes, torch.tensor([codes.shape[-1]]))
    for n in (1, 4, 7):
        part, _ = tiny_model.decode(codes[..., :n], torch.tensor([n]))
        assert max_diff(part, full[..., : part.shape[-1]]) < 1e-6


def test_codes_at_or_above_1000_wrap(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    codes = decode_case["codes"]
    with torch.inference_mode():
        assert torch.equal(tiny_model.decode_latent(codes + 1000), tiny_model.decode_latent(codes))


def test_decode_rejects_bad_inputs(tiny_model: FireflyGenerator, decode_case: dict) -> None:
    codes = decode_case["codes"]
    with pytest.raises(ValueError):
        tiny_model.decode(codes, torch.tensor([codes.shape[-1] + 1]))
    with pytest.raises(ValueError):
        tiny_model.decode(codes[:, :3], torch.tensor([1]))
    with pytest.raises(ValueError):
        tiny_model.decode(codes.float(), torch.tensor([1]))
    wav, lengths = tiny_model.decode(codes[..., :0], torch.tensor([0]))
    assert wav.shape == (1, 1, 0) and lengths.tolist() == [0]


def test_bf16_decode_close(decode_case: dict, tiny_config: FireflyConfig) -> None:
    model = load_firefly(TINY / "generator.pth", tiny_config, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    wav, _ = model.decode(decode_case["codes"], decode_case["feature_lengths"])
    assert wav.dtype == torch.float32
    assert max_diff(wav, decode_case["waveform"]) < BF16_TOL


# ---------------------------------------------------------------------------- encode
def test_encode_matches_reference(tiny_model: FireflyGenerator, encode_case: dict) -> None:
    audio, lengths = encode_case["audio"], encode_case["audio_lengths"]
    with torch.inference_mode():
        assert max_diff(tiny_model.log_mel(audio), encode_case["log_mel"]) < PARITY_TOL
    out = tiny_model.encode_intermediates(audio, lengths)
    for name in ("log_mel", "backbone_features", "quantizer_downsampled", "fsq_bounded_pre_round"):
        ours, ref = getattr(out, name), encode_case[name]
        assert ours.shape == ref.shape, name
        assert max_diff(ours, ref) < PARITY_TOL, name
    assert torch.equal(out.codes, encode_case["codes"])
    assert torch.equal(out.feature_lengths, encode_case["feature_lengths"])
    codes, feature_lengths = tiny_model.encode(audio, lengths)
    assert torch.equal(codes, out.codes) and torch.equal(feature_lengths, out.feature_lengths)


def test_encode_rejects_too_short_audio(tiny_model: FireflyGenerator) -> None:
    with pytest.raises(ValueError):
        tiny_model.encode(torch.zeros(1, 1, 10), torch.tensor([10]))


# ---------------------------------------------------------------------------- loading
def _old_style(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        key = key.replace("parametrizations.weight.original0", "weight_g")
        out[key.replace("parametrizations.weight.original1", "weight_v")] = value
    return out


def _folded(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in sd.items() if "parametrizations" not in k}
    for key in sd:
        if key.endswith("original0"):
            base = key[: -len("parametrizations.weight.original0")]
            out[base + "weight"] = fold_weight_norm(
                sd[key], sd[base + "parametrizations.weight.original1"]
            )
    return out


def test_all_checkpoint_styles_load_identically(
    tmp_path: Path, raw_state_dict: dict, decode_case: dict, tiny_config: FireflyConfig
) -> None:
    wrapped = {f"generator.{k}": v for k, v in _old_style(raw_state_dict).items()}
    wrapped["discriminator.conv.weight"] = torch.zeros(3)
    variants = {
        "old.pth": _old_style(raw_state_dict),
        "wrapped.ckpt": {"state_dict": wrapped, "epoch": 3},
        "folded.pth": _folded(raw_state_dict),
    }
    paths = [TINY / "generator.pth"]
    for name, sd in variants.items():
        torch.save(sd, tmp_path / name)
        paths.append(tmp_path / name)
    save_file(raw_state_dict, str(tmp_path / "gen.safetensors"))
    paths.append(tmp_path / "gen.safetensors")
    codes, lengths = decode_case["codes"], decode_case["feature_lengths"]
    outputs = [load_firefly(p, tiny_config).decode(codes, lengths)[0] for p in paths]
    for path, wav in zip(paths[1:], outputs[1:], strict=True):
        assert torch.equal(wav, outputs[0]), path.name


def test_strict_loading_rejects_missing_and_unexpected(
    tmp_path: Path, raw_state_dict: dict, tiny_config: FireflyConfig
) -> None:
    missing = dict(raw_state_dict)
    del missing["head.conv_post.conv.bias"]
    torch.save(missing, tmp_path / "missing.pth")
    with pytest.raises(ValueError, match=r"head\.conv_post\.conv\.bias"):
        load_firefly(tmp_path / "missing.pth", tiny_config)
    extra = {**raw_state_dict, "head.bogus.weight": torch.zeros(1)}
    torch.save(extra, tmp_path / "extra.pth")
    with pytest.raises(ValueError, match=r"head\.bogus\.weight"):
        load_firefly(tmp_path / "extra.pth", tiny_config)
    with pytest.raises(ValueError, match="shape") as wrong_config:
        load_firefly(TINY / "generator.pth", FireflyConfig.released())
    assert "is the config the one this checkpoint was trained with?" in str(wrong_config.value)
    assert len(str(wrong_config.value)) < 1500  # a few examples, not every key


def test_missing_files_raise_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.pth"):
        load_firefly(tmp_path / "nope.pth", TINY / "config.json")
    with pytest.raises(FileNotFoundError):
        load_firefly(TINY / "generator.pth", tmp_path / "nope.yaml")


def test_released_architecture_keys_and_param_count() -> None:
    reference = json.loads((FULL / "decoder_state_dict_shapes.json").read_text())
    model = build_dummy_firefly(FireflyConfig.released(), device="meta")
    shapes = expected_checkpoint_shapes(model)
    assert shapes == {k: tuple(v) for k, v in reference["keys"].items()}
    assert len(shapes) == 547
    assert checkpoint_param_count(model) == reference["n_params"] == 47_065_218
    old = expected_checkpoint_shapes(model, style="old")
    assert sum(k.endswith("weight_g") for k in old) == sum(k.endswith("original0") for k in shapes)


def test_tiny_param_count(tiny_model: FireflyGenerator) -> None:
    meta = json.loads((TINY / "meta.json").read_text())
    assert checkpoint_param_count(tiny_model) == meta["n_params"]


def test_dummy_model_is_deterministic(tiny_config: FireflyConfig, decode_case: dict) -> None:
    a = load_firefly(None, tiny_config, load_format="dummy", seed=7)
    b = build_dummy_firefly(tiny_config, seed=7)
    codes, lengths = decode_case["codes"], decode_case["feature_lengths"]
    wav_a, _ = a.decode(codes, lengths)
    assert torch.equal(wav_a, b.decode(codes, lengths)[0])
    assert torch.isfinite(wav_a).all()

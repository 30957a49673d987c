"""Model factories and pretrained .npz loading (Google's ViT / Mixer formats, state-dict npz)."""

import numpy as np
import pytest
import torch

from compbench.models.mlp import mlp
from compbench.models.resnet20 import resnet20
from compbench.models.timm_models import timm_model
from compbench.models.weights import export_google_mixer_npz, export_google_vit_npz, load_google_mixer_npz


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], msg=k)


def _small_mixer():
    # Mixer-B/16's layout with 2 narrow blocks keeps the test fast; the npz format is per block.
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=10, img_size=32, patch_size=16, num_blocks=2, embed_dim=64)


def test_google_vit_npz_round_trip_through_timms_loader(tmp_path):
    torch.manual_seed(0)
    source = timm_model("vit_tiny_patch16_224", num_classes=10, image_size=32)
    path = tmp_path / "ViT.npz"
    export_google_vit_npz(source, str(path))
    torch.manual_seed(1)
    _assert_same(source,
                 timm_model("vit_tiny_patch16_224", num_classes=10, image_size=32, pretrained=str(path)))


def test_google_mixer_npz_round_trip(tmp_path):
    torch.manual_seed(0)
    source = _small_mixer()
    path = tmp_path / "Mixer.npz"
    export_google_mixer_npz(source, str(path))
    assert "MixerBlock_1/token_mixing/Dense_0/kernel" in np.load(path).files
    torch.manual_seed(1)
    loaded = _small_mixer()
    load_google_mixer_npz(loaded, str(path), "mixer_b16")
    _assert_same(source, loaded)


def test_vit_checkpoint_into_mixer_is_a_clear_error(tmp_path):
    path = tmp_path / "vit.npz"
    export_google_vit_npz(timm_model("vit_tiny_patch16_224", num_classes=10, image_size=32), str(path))
    with pytest.raises(ValueError, match="does not match this model"):
        load_google_mixer_npz(_small_mixer(), str(path), "mixer_b16")


def test_state_dict_npz_round_trip_and_mismatch(tmp_path):
    source = resnet20()
    path = tmp_path / "r20.npz"
    np.savez(path, **{k: v.numpy() for k, v in source.state_dict().items()})
    _assert_same(source, resnet20(pretrained=str(path)))
    with pytest.raises(ValueError, match="does not match this model"):
        mlp(pretrained=str(path))


def test_resnet20_shape_and_size():
    model = resnet20(num_classes=10)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert 0.26e6 < sum(p.numel() for p in model.parameters()) < 0.28e6


def test_cnn_shape_size_and_image_size_rule():
    from compbench.models.cnn import cnn

    model = cnn(num_classes=10, image_size=28, in_chans=1)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in model.parameters()) == 206922
    # Channels-last activations only: the gradients compressors flatten stay contiguous.
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    assert all(p.grad.is_contiguous() for p in model.parameters())
    assert cnn(num_classes=10, image_size=32, in_chans=3)(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ValueError, match="model=cnn: image_size=30 must be a multiple of 4"):
        cnn(image_size=30)


def test_profiled_model_has_the_architectures_gradients_in_backward_order():
    import torchvision

    from compbench.models.profiled import profiled

    torch.manual_seed(0)
    model = profiled("resnet50", backward_ms=1.0, num_classes=10, image_size=8)
    reference = [p.shape for p in torchvision.models.resnet50(weights=None).parameters()]
    assert [w.shape for w in model.weights] == reference and len(reference) == 161
    assert sum(model.sleep_s) == pytest.approx(1e-3)
    order = []
    for i, w in enumerate(model.weights):
        w.register_post_accumulate_grad_hook(lambda _, i=i: order.append(i))
    fixed = model.grads[3].clone()
    for _ in range(2):
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        model.weights[3].grad.mul_(5)  # what a pipeline may do in place
    assert order[:161] == list(range(160, -1, -1))  # last layer first, as back-propagation runs
    assert torch.equal(model.grads[3], fixed)


def test_gpt_is_causal_and_ties_its_embeddings():
    from compbench.models.gpt import gpt

    torch.manual_seed(0)
    model = gpt(vocab_size=11, block_size=16, n_layer=2, n_embd=32, n_head=4).eval()
    assert model.head.weight is model.tok.weight
    names = [n for n, _ in model.named_parameters()]
    assert "tok.weight" in names and "head.weight" not in names  # one tensor, one gradient
    x = torch.randint(11, (2, 16))
    out = model(x)
    assert out.shape == (2, 16, 11)
    t = 9
    changed = x.clone()
    changed[:, t] = (x[:, t] + 1) % 11
    out2 = model(changed)
    torch.testing.assert_close(out2[:, :t], out[:, :t])  # the future never leaks into the past
    assert (out2[:, t:] - out[:, t:]).abs().max() > 1e-4  # and the change is seen from t on
    with pytest.raises(ValueError, match="longer than model.block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of model.n_head"):
        gpt(vocab_size=11, n_embd=30, n_head=4)

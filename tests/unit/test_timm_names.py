"""Any timm model by its timm name (`model=timm model.arch=NAME`, compbench.models.timm_models): built
for the data's image size where its position embeddings fix one, refused in one line naming the fix
where the data cannot feed it. Models are built on the meta device (nothing allocated)."""

from __future__ import annotations

import warnings

import pytest
import torch

from compbench.compose import config
from compbench.models.timm_models import timm_model

DATA = ["dataset=synthetic", "dataset.image_size=32", "engine.np=2"]


def _check(*overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config.check(config.compose([*DATA, *overrides]))


@pytest.mark.parametrize("name", ["mobilenetv3_small_050", "convnext_atto", "deit_tiny_patch16_224",
                                  "vit_base_patch16_224.augreg_in21k"])
def test_a_timm_name_passes_the_config_check(name):
    """A CNN (any size), a fixed-size transformer (built for the data's 32x32), a name with its tag."""
    cfg = _check("model=timm", f"model.arch={name}")
    assert cfg.choices.model == "timm" and cfg.model.arch == name


def test_a_fixed_size_model_is_built_for_the_datas_images():
    with torch.device("meta"):
        model = timm_model("deit_tiny_patch16_224", num_classes=10, image_size=32)
        scores = model(torch.empty(2, 3, 32, 32))
    assert model.patch_embed.img_size == (32, 32) and scores.shape == (2, 10)


def test_the_options_arch_is_a_name_model_takes():
    """model=timm's default arch, as the ViT and Mixer options' archs, is a name `model=` takes."""
    cfg = config.compose([*DATA, "model=mobilenetv3_small_050"])
    assert cfg.choices.model == "timm" and cfg.model.arch == "mobilenetv3_small_050"


@pytest.mark.parametrize("overrides, message, fix", [
    (["model.arch=mobilenetv3_smal_050"],
     "model.arch=mobilenetv3_smal_050 is not a timm model; did you mean mobilenetv3_small_050",
     "e.g. model=timm model.arch=efficientnet_b0"),
    # a fixed-size model that cannot be built for the data's images: timm's input_size is the fix
    (["model.arch=botnet26t_256", "dataset.image_size=8"],
     "model.arch=botnet26t_256 is built for one image size and cannot take the data's 8x8 images (Trying to "
     "create tensor with negative dimension -1: [-1, 64]); pass dataset.image_size=256 (timm's input_size "
     "for it)", ""),
    # a CNN whose strides leave nothing of a 32x32 image: the config check's one meta forward
    (["model.arch=inception_v3"],
     "model=timm (model.arch=inception_v3) does not take the data's 3x32x32 images",
     "pass dataset.image_size=75 (the smallest of 32, 64, 75, 128, 224, 299 it takes)"),
    (["model.arch=resnet18", "model.pretrained=ViT-B_16.npz"],
     "model.pretrained=ViT-B_16.npz: compbench reads Google's ViT and Mixer .npz checkpoints, and "
     "model.arch=resnet18 is neither; pass model.pretrained=null", ""),
], ids=["unknown name", "fixed size, data too small", "cnn, data too small", "pretrained, not vit"])
def test_a_name_the_data_cannot_feed_is_one_line_naming_the_fix(overrides, message, fix):
    with pytest.raises(ValueError) as e:
        _check("model=timm", *overrides)
    said = str(e.value)
    assert said.startswith(message) and said.endswith(fix) and "\n" not in said, said

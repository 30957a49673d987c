"""Model factories: CIFAR ResNet-20, torchvision ResNet/VGG, timm ViT/Mixer, and an MLP."""

import compbench.base.torchvision_compat  # noqa: F401  (before timm/torchvision are imported)

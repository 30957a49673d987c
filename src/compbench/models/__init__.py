"""Model factories: CIFAR ResNet-20, torchvision ResNet/VGG, timm ViT/Mixer, and an MLP."""

import compbench._torchvision_compat  # noqa: F401  (before timm/torchvision are imported)

"""Model factories: CIFAR ResNet-20, torchvision ResNet/VGG, timm ViT/Mixer, and an MLP."""

"""Models: the factory (built-in, tiny and packaged pretrained models), torch.compile of decoder layers, and offline-first hub loading."""

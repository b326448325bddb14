"""Models: the factory (built-in, tiny and packaged pretrained models), torch.compile of decoder layers, FSDP2 sharding of decoder layers (fsdp), and offline-first hub loading."""

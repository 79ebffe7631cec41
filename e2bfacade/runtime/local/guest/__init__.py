"""The guest side of a local sandbox (envd's half): its processes through the guest agent,
its files through the host's confined opener, its ports through its network namespace."""

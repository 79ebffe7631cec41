"""What a local sandbox's files are made of: images and their layers (images.py,
layers.py), each sandbox's own disk (disks.py), and bounded walks of guest-made trees
(trees.py)."""

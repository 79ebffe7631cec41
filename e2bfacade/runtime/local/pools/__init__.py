"""Work done ahead of creates, each pool owning its claim and its refill: spare launchers
parked in their cgroups (spares.py), formatted disks (disks.py), started sandboxes of a
template's shape (warm.py)."""

"""Several hosts as one service (docs/fleet.md): each host's membership in etcd, under a
lease, and the fence that stops a host serving sandbox work before the fleet can think it
dead. A host without ``ETCD_ENDPOINTS`` is a fleet of one and none of this runs."""

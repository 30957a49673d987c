"""Starting workers: local processes under gloo/torch rendezvous or an external launcher
(processes), and the elastic launchers, Horovod Elastic and TorchElastic (elastic)."""

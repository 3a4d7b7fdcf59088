"""GPUs for the slots: which exist (``devices``, through the one NVML door ``nvml``), slots of
several GPUs (``groups``), how many jobs each GPU runs (``packing``, ``throughput``, a job out
of GPU memory: ``out_of_memory``), and NVIDIA's MPS daemon for GPUs that several jobs share
(``mps``, ``mps_daemon``, ``mps_watch``, ``mps_log``)."""

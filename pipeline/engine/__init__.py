"""The towers inside DeepSpeed: the process group, the engine, ZeRO's steps with less host work."""

"""Running stager under a scheduler: the per-job cluster of ``stager job up`` (Slurm).

Over the client and staging, under the CLI; deploy/ at the top of the repository
holds the glue (Slurm epilog, systemd units) that calls these commands.
"""

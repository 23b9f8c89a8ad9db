"""Runtime helpers shared by Tandem's processes: process reports, resource usage, run logs, Redis clients, ports, secrets at rest."""

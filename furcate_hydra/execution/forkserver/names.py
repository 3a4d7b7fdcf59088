"""What ps and top call the fork server and its jobs (a fork keeps the launcher's command line)."""

from __future__ import annotations

__all__ = ["JOB_NAME", "SERVER_NAME"]

SERVER_NAME = "furcate-server"
JOB_NAME = "furcate-job"

"""Volumes: host directories mounted into sandboxes (named volumes that outlive them, and host
paths the operator allows). The checks are pure; the store works on this host's files."""

from .checks import check_mounts, check_volume_name
from .store import VolumeStore

__all__ = ["VolumeStore", "check_mounts", "check_volume_name"]

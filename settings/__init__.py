"""The settings: one declarative file per deployment, the single source of every generated config.pbtxt, chart
value and benchmark parameter. defaults.toml writes every default once; variants/ holds other settings files
that state only what differs. schema.py is their shape, checks.py what must hold, loading.py how files are
read over the defaults, deployment.py several of them in one server, tensorrt_profiles.py the TensorRT
profiles they imply."""

from settings.deployment import Deployment, load_deployment
from settings.loading import DEFAULT_SETTINGS, apply_override, layered, load_settings, override_flags
from settings.schema import ROOT, Settings, SettingsError

__all__ = [
    "DEFAULT_SETTINGS",
    "ROOT",
    "Deployment",
    "Settings",
    "SettingsError",
    "apply_override",
    "layered",
    "load_deployment",
    "load_settings",
    "override_flags",
]

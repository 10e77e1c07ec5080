"""Labels shared by the mirror's pods and everything that selects them (network policy, PodMonitor)."""

APP_LABELS = {"app.kubernetes.io/name": "mirrorkit"}

# Deployment: container image, Kubernetes manifests, systemd units.

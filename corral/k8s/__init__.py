"""corral on Kubernetes: scheduler extender, device plugin, conversion of Kubernetes objects."""

"""Generated gRPC modules of the kubelet device plugin v1beta1 and PodResources v1 APIs."""

"""Regenerate the committed Python modules from the two .proto files (needs grpcio-tools, a dev dependency).

python -m corral.k8s.proto.generate
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTOS = ("corral/k8s/proto/deviceplugin.proto", "corral/k8s/proto/podresources.proto")


def main() -> int:
    from grpc_tools import protoc  # only needed here, so not imported at module load

    args = ["protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}", f"--grpc_python_out={ROOT}", *PROTOS]
    return int(protoc.main(args))


if __name__ == "__main__":
    sys.exit(main())

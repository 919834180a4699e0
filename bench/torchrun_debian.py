#!/usr/bin/python3
"""PyTorch's torchrun (Debian python3-torch 1.13), usable on Debian 12's Python 3.11.

Debian's /usr/bin/torchrun crashes at start on Python 3.11 ("'NoneType' object has
no attribute 'get'"): torch 1.13's Std.from_str iterates an IntFlag, and Python 3.11
no longer yields its zero member. This wrapper fixes that one function and runs the
real torchrun unchanged. Flags use torchrun 1.13's spelling, e.g.
  torchrun --nproc_per_node 2 --master_port 29500 --no_python ./build/dtorch train ...
The tests run PyTorch 1.13's torchrun through it (tests/models/python_peer.h).
"""
import re
import sys

import torch.distributed.elastic.multiprocessing.api as api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""specwatch: the CLI that wires the packages together (`specwatch up`, `vllm check`, ...).

`common` is the leaf every package may import (usage errors, ports, child processes); it imports
nothing of ours. The rest of this package sits on top of all the others.
"""

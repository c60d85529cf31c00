package datapath

// The compiler is pinned (clang-14, Debian's; the Makefile's generate target
// installs it and refuses another version): another clang emits another
// object, and make generate must reproduce the committed one byte for byte.
// bpf/include holds the asm/ headers of the BPF target, so no host
// architecture's header folder is needed.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -Ibpf/include" -target bpfel -go-package datapath datapath bpf/datapath.c

// The table of the maps it pins, and its digest, which CNI verbs check pins
// by without parsing the object (OpenPinned).
//go:generate go run ./internal/pinsgen -object datapath_bpfel.o -o pins_gen.go

// The same program without the drop monitor, for BenchmarkDropMonitor
// alone (testdata: never built into a binary).
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -Ibpf/include -DGALACTIC_NO_DROP_MONITOR" -target bpfel -go-package datapath -output-dir testdata/nomonitor nomonitor bpf/datapath.c

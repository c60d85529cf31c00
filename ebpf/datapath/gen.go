package datapath

// The compiler is pinned (clang-14, Debian's; the Makefile's generate target
// installs it and refuses another version): another clang emits another
// object, and make generate must reproduce the committed one byte for byte.
// bpf/include holds the asm/ headers of the BPF target, so no host
// architecture's header folder is needed.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -Ibpf/include" -target bpfel -go-package datapath datapath bpf/datapath.c

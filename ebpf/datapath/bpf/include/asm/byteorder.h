/* The BPF target's asm/byteorder.h: bpfel is little-endian (see ../README). */
#include <linux/byteorder/little_endian.h>

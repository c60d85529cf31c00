// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The TCX ingress program of tenant taps and the maps it reads. Every
// per-interface map is keyed by the ingress ifindex (host_only_port by a key
// that starts with it); node/attachreg is the one place that writes and
// removes those rows. Layouts here are mirrored by types.go; a test compares
// the sizes against this object's BTF.
//
// The rules it enforces are stated in docs/datapath.md; each one is guarded
// by a case of ebpf/datapath's frame test, which writes frames into a real
// tap and checks the counters and where the frame went.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// TCX verdicts (linux/bpf.h enum tcx_action_base); Debian's headers predate
// them, so they are named here.
#define GALACTIC_TCX_NEXT (-1)
#define GALACTIC_TCX_DROP 2

#define AF_INET 2
#define AF_INET6 10

#define MAX_INTERFACES 65536
#define MAX_ETHERTYPES 8
#define MAX_PROTOCOLS 8
// IPv6 extension headers walked before the upper-layer header; a longer
// chain is malformed. Legitimate traffic carries two or three at most.
#define MAX_EXT_HEADERS 8
// Fragmented datagrams in flight whose first fragment's decision is
// remembered, per interface: one tenant's datagrams never evict another's.
#define FRAGMENTS_PER_INTERFACE 256
// Host-only ports of one interface, held in its rules.
#define MAX_HOST_PORTS 16
// Address prefixes of the attachment, per family, held in its rules.
#define MAX_PREFIXES 4
// Route answers kept per CPU, and for how long (jiffies: 64 ms at HZ=1000,
// 256 ms at HZ=250). The kernel's route lookup costs more than the rest of
// the program; a tenant's frames mostly go to few destinations.
#define ROUTE_CACHE_SLOTS 4096
#define ROUTE_CACHE_JIFFIES 64
// Blocks of the host filter (host_filter), of 512 bits (a cache line) each.
#define HOST_FILTER_BLOCKS 512
#define HOST_BLOCK_BITS 512

enum action { ACTION_ALLOW = 0, ACTION_DENY = 1 };
enum decision {
	DECISION_ALLOW = 0,
	DECISION_DENY = 1,
	DECISION_HOST_ONLY = 2,
	DECISION_MALFORMED = 3,
	DECISION_SPOOFED = 4, // dropped by anti-spoofing
};
enum reason {
	REASON_POLICY_UNAVAILABLE = 0,
	REASON_IDENTITY_UNAVAILABLE = 1,
	REASON_DECISIONS_FULL = 2,
	REASON_MAX = 4,
};
enum egress { EGRESS_TAP = 1, EGRESS_VETH = 2 };

// The rules of docs/datapath.md ("How a frame is judged"), by their
// numbers there: a drop record names the one that decided.
enum rule {
	RULE_NO_RULES = 1,
	RULE_VLAN = 2,
	RULE_ETHERTYPES = 3,
	RULE_SPOOFED_MAC = 4,
	RULE_ARP = 5,
	RULE_NON_IP = 6,
	RULE_MALFORMED = 7, // and 8: an IPv6 extension header chain not walked
	RULE_FRAGMENTS = 9,
	RULE_SPOOFED_IP = 10,
	RULE_PROTOCOLS = 11,
	RULE_HOST_PORTS = 13,
	RULE_ND = 14,
	RULE_ICMP = 15,
	RULE_HOST_PROTOCOLS = 16,
	RULE_DEFAULT = 17,
};

// A drop record's decision when the tap had no rules (policy_unavailable).
#define DROP_NO_RULES 255
#define DECISION_MAX 8
// The drop monitor: at most DROP_RECORDS_PER_SECOND records per tap and
// second (a flood costs one budget lookup per frame beyond them), the
// frame's first DROP_RECORD_BYTES, in a ring of DROP_RING_BYTES.
#define DROP_RECORDS_PER_SECOND 32
#define DROP_RECORD_BYTES 128
#define DROP_RING_BYTES (256 * 1024)
#define DROP_BUDGETS 8192
enum lost { LOST_RING_FULL = 0, LOST_RATE_LIMITED = 1, LOST_MAX = 2 };

// host_view.flags
#define HOST_VIEW_PARTIAL 0x1 // the filter cannot cover every host prefix: ask the route lookup

// traffic_policy.flags and tap_rules.flags
#define POLICY_SPOOFING_ALLOWED 0x1 // anti-spoofing off (it is on by default)
// tap_rules.flags only
#define RULES_UNBOUND 0x2 // derived from an older build's rows, no binding known: operators see it, the program ignores it

struct vrf_binding {
	__u32 table;
	__u16 attachment;
	__u16 _pad;
	__u64 vpc;
};

struct traffic_policy {
	__u64 generation;
	__u8 default_action;
	__u8 n_ethertypes;
	__u8 n_protocols;
	__u8 flags;
	__u16 ethertypes[MAX_ETHERTYPES]; // host byte order
	__u8 protocols[MAX_PROTOCOLS];
	__u8 _pad2[4];
};

struct gateway {
	__u8 ipv4[4];  // all zero: none
	__u8 ipv6[16]; // all zero: none
};

struct host_port_key {
	__u32 ifindex;
	__u16 port; // host byte order
	__u8 protocol;
	__u8 _pad;
};

struct host_port {
	__u16 port; // host byte order
	__u8 protocol;
	__u8 _pad;
};

// An address prefix of the attachment: the address in network byte order
// and its length. IPv4 uses the first 4 bytes.
struct prefix4 {
	__u8 addr[4];
	__u8 len;
	__u8 _pad[3];
};

struct prefix6 {
	__u8 addr[16];
	__u8 len;
	__u8 _pad[3];
};

// rules is everything the program judges an interface's frames by: one
// registration's policy, gateway, host-only ports, the attachment's MAC and
// addresses, and its identity, read whole.
struct rules {
	__u32 ifindex; // whose rules these are; 0 while they are being removed
	__u16 attachment;
	__u8 default_action;
	__u8 flags;
	__u64 vpc;
	__u64 generation;
	__u8 n_ethertypes;
	__u8 n_protocols;
	__u8 n_ports;
	__u8 _pad[5];
	__u16 ethertypes[MAX_ETHERTYPES]; // host byte order
	__u8 protocols[MAX_PROTOCOLS];
	__u8 gateway_ipv4[4];  // all zero: none
	__u8 gateway_ipv6[16]; // all zero: none
	__u8 _pad2[4];
	struct host_port ports[MAX_HOST_PORTS];
	__u8 mac[6]; // the attachment's; all zero: not known
	__u8 n_prefixes4;
	__u8 n_prefixes6;
	struct prefix4 prefixes4[MAX_PREFIXES];
	struct prefix6 prefixes6[MAX_PREFIXES];
};

// tap_rules is the tap_rules value: the rules and the lock that makes a
// reader see one complete version of them. node/attachreg writes it with
// BPF_F_LOCK, in place, so an update never swaps the element under a reader.
struct tap_rules {
	struct bpf_spin_lock lock;
	__u32 _pad;
	struct rules rules;
};

struct decision_key {
	__u64 vpc;
	__u16 attachment;
	__u8 decision;
	__u8 _pad[5];
};

// A fragmented datagram as the kernel reassembles it (IPv4: addresses,
// protocol and ID; IPv6: addresses and ID), on one interface.
struct fragment_key {
	__u32 ifindex;
	__u32 id;
	__u8 family;
	__u8 protocol; // IPv4 only
	__u8 _pad[2];
	__u8 src[16];
	__u8 dst[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, struct vrf_binding);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ifindex_vrf SEC(".maps");

// The rows the program reads: one value per interface, read under its lock.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, struct tap_rules);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_rules SEC(".maps");

// traffic_policy, tenant_gateway and host_only_port hold the same
// registration split by kind. This program does not read them: programs of
// older builds, still attached to taps those builds registered, do.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, struct traffic_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} traffic_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_kind SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, struct gateway);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tenant_gateway SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4 * MAX_INTERFACES);
	__type(key, struct host_port_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} host_only_port SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 3 * MAX_INTERFACES);
	__type(key, struct decision_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} decisions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, REASON_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unattributed SEC(".maps");

// The decision on the first fragment of each fragmented datagram of an
// interface, which every later fragment of it gets; the last one takes it
// away. One map per interface (node/attachreg adds it when it registers the
// interface), so that one tenant's datagrams only ever make room among its
// own, least recently used first.
// Sizes, not types: BTF would carry the key's struct only as a declaration
// this deep in a map definition.
struct fragments_of_interface {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FRAGMENTS_PER_INTERFACE);
	__uint(key_size, sizeof(struct fragment_key));
	__uint(value_size, sizeof(__u8));
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct fragments_of_interface);
} tap_fragments SEC(".maps");

// The route lookup's answer for a destination of an interface: whether the
// host receives packets to it.
struct route_answer {
	__u64 expires; // jiffies
	__u64 epoch;   // route_epoch when it was answered
	__u32 ifindex;
	__u8 family;
	__u8 to_host;
	__u8 _pad[2];
	__u8 dst[16];
};

// A direct-mapped cache of route answers, per CPU so that entries are never
// torn. Shared by every loaded instance of the program: datapath.Load pins it
// under the state folder, apart from the maps of rows.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ROUTE_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct route_answer);
} route_cache SEC(".maps");

// Where read_rules copies the rules of the frame being judged, per CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rules);
} rules_scratch SEC(".maps");

// Bumped by the node daemon on every address and route change it reads from
// the kernel: a cached answer of an older epoch is asked again.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} route_epoch SEC(".maps");

// The node daemon's view of the addresses the host receives packets to, in
// every routing table of the namespace: a blocked Bloom filter over the
// prefixes of its local, broadcast and anycast routes. A destination whose
// bits are clear is the host's in no table, so the kernel forwards it or
// drops it, never delivers it; one whose bits are set may be, and the route
// lookup says. The filter stays small enough to stay in the CPU's cache when
// a tenant sprays destinations, which per-destination answers do not, and a
// destination's bits lie in one block: that of its /16 (IPv4) or /64
// (IPv6). Its bits: one of its address (a host address), one of that /16 or
// /64 (a host prefix of it, or covering it).
struct host_block {
	__u64 bits[HOST_BLOCK_BITS / 64];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HOST_FILTER_BLOCKS);
	__type(key, __u32);
	__type(value, struct host_block);
} host_filter SEC(".maps");

// Whether host_filter may be trusted: until valid_until (CLOCK_MONOTONIC_COARSE
// ns), which the daemon pushes forward while it reads every route event. A
// daemon that stopped lets it lapse, and the route lookup answers again.
struct host_view {
	__u64 valid_until;
	__u32 flags;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct host_view);
} host_view SEC(".maps");

// Node-wide counts of judged frames by decision, per CPU: the allowed path
// pays an inlined array lookup and a plain add. Shared state, pinned apart.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DECISION_MAX);
	__type(key, __u32);
	__type(value, __u64);
} decision_totals SEC(".maps");

// A sampled record of a dropped frame, for the node daemon's drop monitor.
struct drop_record {
	__u64 time; // bpf_ktime_get_ns: CLOCK_MONOTONIC
	__u64 vpc;
	__u32 ifindex;
	__u32 length; // the frame's, from its Ethernet header
	__u16 attachment;
	__u8 decision; // enum decision, or DROP_NO_RULES
	__u8 rule;     // enum rule
	__u16 captured;
	__u8 _pad[2];
	__u8 frame[DROP_RECORD_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, DROP_RING_BYTES);
} drop_records SEC(".maps");

// Each tap's budget of records in the current second. Updated without a
// lock: CPUs racing at a window's edge may each write one record over the
// budget, at most one per CPU and second.
struct drop_budget {
	__u64 window; // ns, start of the current second
	__u32 used;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, DROP_BUDGETS);
	__type(key, __u32);
	__type(value, struct drop_budget);
} drop_budgets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LOST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drop_records_lost SEC(".maps");

static __always_inline void count_total(__u8 decision)
{
	__u32 k = decision;
	__u64 *n = bpf_map_lookup_elem(&decision_totals, &k);
	if (n)
		*n += 1;
}

#ifndef GALACTIC_NO_DROP_MONITOR
static __always_inline void count_lost(__u32 why)
{
	__u64 *n = bpf_map_lookup_elem(&drop_records_lost, &why);
	if (n)
		*n += 1;
}
#endif

// record_drop writes a record of a dropped frame, within its tap's budget.
// Allowed frames never come here.
static __always_inline void record_drop(struct __sk_buff *skb, __u32 ifindex, __u64 vpc, __u16 attachment, __u8 decision,
					__u8 rule)
{
#ifndef GALACTIC_NO_DROP_MONITOR
	__u64 now = bpf_ktime_get_ns();
	struct drop_budget *b = bpf_map_lookup_elem(&drop_budgets, &ifindex);
	if (!b) {
		struct drop_budget fresh = {.window = now};
		bpf_map_update_elem(&drop_budgets, &ifindex, &fresh, BPF_NOEXIST);
		b = bpf_map_lookup_elem(&drop_budgets, &ifindex);
		if (!b) {
			count_lost(LOST_RATE_LIMITED);
			return;
		}
	}
	if (now - b->window >= 1000000000ULL) {
		b->window = now;
		b->used = 0;
	}
	if (b->used >= DROP_RECORDS_PER_SECOND) {
		count_lost(LOST_RATE_LIMITED);
		return;
	}
	b->used += 1;
	struct drop_record *rec = bpf_ringbuf_reserve(&drop_records, sizeof(*rec), 0);
	if (!rec) {
		count_lost(LOST_RING_FULL);
		return;
	}
	rec->time = now;
	rec->vpc = vpc;
	rec->ifindex = ifindex;
	rec->length = skb->len;
	rec->attachment = attachment;
	rec->decision = decision;
	rec->rule = rule;
	rec->captured = 0;
	rec->_pad[0] = 0;
	rec->_pad[1] = 0;
	__u32 n = skb->len;
	if (n > DROP_RECORD_BYTES)
		n = DROP_RECORD_BYTES;
	if (n >= 1 && bpf_skb_load_bytes(skb, 0, rec->frame, n) == 0)
		rec->captured = n;
	bpf_ringbuf_submit(rec, 0);
#endif
}

static __always_inline void count_unattributed(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&unattributed, &reason);
	if (n)
		__sync_fetch_and_add(n, 1);
}

// count_decision counts d against the interface's identity. When the
// decisions map is full and the identity has no row yet, the frame is still
// judged, and counted as unattributed decisions_full.
static __always_inline void count_decision(const struct rules *r, __u8 decision)
{
	struct decision_key key = {.vpc = r->vpc, .attachment = r->attachment, .decision = decision};
	__u64 *n = bpf_map_lookup_elem(&decisions, &key);
	if (!n) {
		__u64 zero = 0;
		bpf_map_update_elem(&decisions, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&decisions, &key);
		if (!n) {
			count_unattributed(REASON_DECISIONS_FULL);
			return;
		}
	}
	__sync_fetch_and_add(n, 1);
}

static __always_inline int listed16(const __u16 *list, __u8 n, __u16 v)
{
#pragma unroll
	for (int i = 0; i < MAX_ETHERTYPES; i++)
		if (i < n && list[i] == v)
			return 1;
	return 0;
}

static __always_inline int listed8(const __u8 *list, __u8 n, __u8 v)
{
#pragma unroll
	for (int i = 0; i < MAX_PROTOCOLS; i++)
		if (i < n && list[i] == v)
			return 1;
	return 0;
}

// Addresses are compared as 32-bit words copied out, so that no load depends
// on the alignment of the bytes.
static __always_inline __u32 word(const __u8 *a)
{
	__u32 w;
	__builtin_memcpy(&w, a, 4);
	return w;
}

static __always_inline int equal4(const __u8 *a, const __u8 *b)
{
	return word(a) == word(b);
}

static __always_inline int equal16(const __u8 *a, const __u8 *b)
{
	return word(a) == word(b) && word(a + 4) == word(b + 4) && word(a + 8) == word(b + 8) && word(a + 12) == word(b + 12);
}

static __always_inline int zero16(const __u8 *a)
{
	return (word(a) | word(a + 4) | word(a + 8) | word(a + 12)) == 0;
}

static __always_inline __u8 by_default(const struct rules *pol)
{
	return pol->default_action == ACTION_ALLOW ? DECISION_ALLOW : DECISION_DENY;
}

// The deepest offset a header is read at. Headers lie in a frame's first
// bytes; the bound lets the verifier check every pointer into the frame.
#define MAX_HEADER_OFFSET 1024

// load copies len bytes at off in the frame into to, wherever the kernel
// keeps them (the linear area or page fragments), and returns 0; it returns
// -1 when the frame is shorter. A copy through the helper, not direct packet
// access: the daemon loads this program with CAP_BPF and CAP_NET_ADMIN only,
// and without CAP_PERFMON the verifier refuses packet pointer arithmetic by a
// variable offset (its Spectre v1 sanitation covers only stack and map
// values) and any comparison of a packet pointer, even with NULL
// (docs/datapath.md, "Privileges").
static __always_inline int load(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	if (off > MAX_HEADER_OFFSET)
		return -1;
	return bpf_skb_load_bytes(skb, off, to, len) < 0 ? -1 : 0;
}

// What the program learnt of an IP packet.
struct packet {
	__u8 src[16], dst[16]; // IPv4 in the first 4 bytes
	__u32 l4off;           // offset of the upper-layer header in the frame
	__u32 end;             // offset of the end of the IP packet in the frame
	__u32 frag_id;
	__u16 sport, dport; // TCP and UDP
	__u8 icmp_type;     // ICMP and ICMPv6
	__u8 is6;
	__u8 l4proto;
	__u8 fragment; // 0: none, 1: first fragment, 2: a later fragment
	__u8 last_fragment; // a later fragment without "more fragments"
	__u8 l4_read;       // l4 holds the upper layer's first 4 bytes at l4off
	__u8 l4[4];
};

// The frame's first bytes, read in one call where the frame holds them:
// the Ethernet header and, for IP, the fixed IP header and the upper layer's
// first 4 bytes. Each helper call costs about as much as the rest of the
// header's rules. The pad puts the IP header on a 4-byte boundary.
struct headers {
	__u8 _pad[2];
	struct ethhdr eth;
	union {
		struct {
			struct iphdr ip;
			__u8 l4[4];
		} v4;
		struct {
			struct ipv6hdr ip6;
			__u8 l4[4];
		} v6;
	};
};

// parse_ipv4 fills p from the IPv4 header, taken from h when it holds it
// (ip_read); a header the kernel would refuse or that the frame cannot hold
// is malformed.
static __always_inline int parse_ipv4(struct __sk_buff *skb, struct packet *p, const struct headers *h, int ip_read)
{
	struct iphdr ip;
	if (ip_read) {
		ip = h->v4.ip;
		__builtin_memcpy(p->l4, h->v4.l4, 4);
		p->l4_read = ip.ihl == 5;
	} else if (load(skb, ETH_HLEN, &ip, sizeof(ip)) < 0) {
		return -1;
	}
	__u32 hlen = ip.ihl * 4;
	__u32 total = bpf_ntohs(ip.tot_len);
	if (ip.version != 4 || hlen < sizeof(ip) || total < hlen || ETH_HLEN + total > skb->len)
		return -1;
	__builtin_memcpy(p->src, &ip.saddr, 4);
	__builtin_memcpy(p->dst, &ip.daddr, 4);
	p->l4proto = ip.protocol;
	p->l4off = ETH_HLEN + hlen;
	p->end = ETH_HLEN + total;
	__u16 frag = bpf_ntohs(ip.frag_off);
	if (frag & 0x1fff) {
		p->fragment = 2;
		p->last_fragment = !(frag & 0x2000);
	} else if (frag & 0x2000)
		p->fragment = 1;
	p->frag_id = bpf_ntohs(ip.id);
	return 0;
}

// parse_ipv6 fills p from the IPv6 header and walks the extension headers
// the kernel walks before the upper layer (hop-by-hop, routing, fragment,
// destination options), in a bounded loop. A chain it cannot finish is
// malformed: longer than MAX_EXT_HEADERS, or running past the packet.
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct packet *p, const struct headers *h, int ip_read)
{
	struct ipv6hdr ip6;
	int l4_read = 0;
	if (ip_read) {
		ip6 = h->v6.ip6;
		__builtin_memcpy(p->l4, h->v6.l4, 4);
		l4_read = 1;
	} else if (load(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0) {
		return -1;
	}
	__u32 end = ETH_HLEN + sizeof(ip6) + bpf_ntohs(ip6.payload_len);
	if (ip6.version != 6 || end > skb->len)
		return -1;
	__builtin_memcpy(p->src, &ip6.saddr, 16);
	__builtin_memcpy(p->dst, &ip6.daddr, 16);
	p->is6 = 1;
	p->end = end;
	__u8 nh = ip6.nexthdr;
	__u32 off = ETH_HLEN + sizeof(ip6);
	for (int i = 0; i < MAX_EXT_HEADERS; i++) {
		if (nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS) {
			__u8 h[2];
			if (off + 2 > end || load(skb, off, h, 2) < 0)
				return -1;
			nh = h[0];
			off += (h[1] + 1) * 8;
		} else if (nh == IPPROTO_FRAGMENT) {
			struct frag_hdr {
				__u8 nexthdr, reserved;
				__be16 frag_off;
				__be32 id;
			} f;
			if (off + sizeof(f) > end || load(skb, off, &f, sizeof(f)) < 0)
				return -1;
			nh = f.nexthdr;
			__u16 fo = bpf_ntohs(f.frag_off);
			p->frag_id = bpf_ntohl(f.id);
			off += sizeof(f);
			if (fo & 0xfff8) {
				// A later fragment: its upper layer is in the first one.
				p->fragment = 2;
				p->last_fragment = !(fo & 1);
				p->l4proto = nh;
				p->l4off = off;
				return 0;
			}
			if (fo & 1)
				p->fragment = 1; // the first; an atomic fragment is no fragment
		} else {
			p->l4proto = nh;
			p->l4off = off;
			// Read with the header when no extension header came between.
			p->l4_read = l4_read && i == 0;
			return off > end ? -1 : 0;
		}
	}
	return -1;
}

// parse_l4 reads the upper-layer fields the rules need: TCP and UDP ports,
// the ICMP type. A first fragment or packet too short to carry them is
// malformed.
static __always_inline int parse_l4(struct __sk_buff *skb, struct packet *p)
{
	__u8 proto = p->l4proto;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != (p->is6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP))
		return 0;
	if (p->l4off + 4 > p->end)
		return -1;
	if (!p->l4_read && load(skb, p->l4off, p->l4, 4) < 0)
		return -1;
	p->sport = (__u16)p->l4[0] << 8 | p->l4[1];
	p->dport = (__u16)p->l4[2] << 8 | p->l4[3];
	p->icmp_type = p->l4[0];
	return 0;
}

static __always_inline __u32 rotl32(__u32 x, int n)
{
	return x << n | x >> (32 - n);
}

// hash_words mixes a seed and four address words so that every bit of them
// moves the result (murmur3's finalizer): a plain xor of the words left an
// index to 8 bits of an IPv4 address, and a tenant spraying 10.9.0.0/20
// shared 256 slots of the route cache. The daemon computes the same for the
// host filter (ebpf/datapath's hostFilterBit).
static __always_inline __u32 hash_words(__u32 seed, __u32 w0, __u32 w1, __u32 w2, __u32 w3)
{
	__u32 h = seed * 0x9e3779b1 ^ w0 ^ rotl32(w1, 8) ^ rotl32(w2, 16) ^ rotl32(w3, 24);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

// block_bit reads the bit h picks in b. The word is picked by constant
// offsets: without CAP_PERFMON the verifier refuses a map value pointer
// moved by a variable that it cannot prove the same on every path.
static __always_inline int block_bit(const struct host_block *b, __u32 h)
{
	__u32 bit = h % HOST_BLOCK_BITS;
	__u32 i = bit / 64;
	__u64 w = 0;
#pragma unroll
	for (__u32 j = 0; j < HOST_BLOCK_BITS / 64; j++) {
		__u64 x = b->bits[j];
		asm volatile("" : "+r"(x)); // keep clang from folding this back into an indexed load
		if (i == j)
			w = x;
	}
	return (w >> (bit % 64)) & 1;
}

// maybe_host says whether p->dst may be an address the host receives
// packets to, by the daemon's view: NOT_HOST, MAYBE_HOST, or NO_VIEW when
// the view lapsed (no daemon renews it).
#define NOT_HOST 0
#define MAYBE_HOST 1
#define NO_VIEW 2
static __always_inline int maybe_host(const struct packet *p)
{
	__u32 zero = 0;
	struct host_view *v = bpf_map_lookup_elem(&host_view, &zero);
	if (!v || bpf_ktime_get_coarse_ns() >= v->valid_until)
		return NO_VIEW;
	if (v->flags & HOST_VIEW_PARTIAL)
		return MAYBE_HOST;
	__u32 w0 = word(p->dst), w1 = 0, w2 = 0, w3 = 0;
	__u32 seed = AF_INET, c0 = w0 & bpf_htonl(0xffff0000), c1 = 0;
	if (p->is6) {
		w1 = word(p->dst + 4);
		w2 = word(p->dst + 8);
		w3 = word(p->dst + 12);
		seed = AF_INET6;
		c0 = w0;
		c1 = w1;
	}
	__u32 coarse = hash_words(seed | 0x100, c0, c1, 0, 0);
	__u32 i = coarse % HOST_FILTER_BLOCKS;
	struct host_block *b = bpf_map_lookup_elem(&host_filter, &i);
	if (!b)
		return MAYBE_HOST;
	return block_bit(b, hash_words(seed, w0, w1, w2, w3)) || block_bit(b, coarse >> 16) ? MAYBE_HOST : NOT_HOST;
}

// routed_to_host asks the kernel's route lookup for this interface whether
// it forwards packets to p->dst; everything it does not forward (local and
// broadcast addresses of the VRF, no route) is for the host. When forwarding
// is off on the interface the kernel forwards nothing from it, so every
// packet is for the host; an unanswered lookup fails closed the same way.
// A destination outside the daemon's view of the host's addresses
// (maybe_host) is forwarded without a lookup: per-destination answers cost a
// cache miss each when a tenant sprays destinations. The lookup's answers
// are cached until the node daemon reports an address or route change
// (route_epoch), and for ROUTE_CACHE_JIFFIES at most. Only while the daemon
// runs: its view lapses when it stops, and then no change bumps the epoch,
// so a cached answer could outlive the route it was read from (an address
// that left the host, now routed to another machine, would still be the
// host's, and its listed ports reachable there). So with no view, every
// frame asks the lookup afresh: the host stays reachable, and only what the
// host receives now counts as its (issue 49).
static __always_inline int routed_to_host(struct __sk_buff *skb, __u32 ifindex, const struct packet *p)
{
	int view = maybe_host(p);
	if (view == NOT_HOST)
		return 0;
	__u32 h = hash_words(ifindex, word(p->dst), word(p->dst + 4), word(p->dst + 8), word(p->dst + 12));
	__u32 slot = h & (ROUTE_CACHE_SLOTS - 1);
	__u8 family = p->is6 ? AF_INET6 : AF_INET;
	__u64 now = bpf_jiffies64();
	// Read before the lookup: an answer is never newer than its epoch.
	__u32 zero = 0;
	__u64 *e = bpf_map_lookup_elem(&route_epoch, &zero);
	__u64 epoch = e ? *e : 0;
	struct route_answer *a = bpf_map_lookup_elem(&route_cache, &slot);
	if (view == MAYBE_HOST && a && a->ifindex == ifindex && a->family == family && equal16(a->dst, p->dst) &&
	    now < a->expires && a->epoch == epoch)
		return a->to_host;

	struct bpf_fib_lookup fib = {.family = family, .ifindex = ifindex};
	if (p->is6) {
		__builtin_memcpy(fib.ipv6_src, p->src, 16);
		__builtin_memcpy(fib.ipv6_dst, p->dst, 16);
	} else {
		fib.ipv4_src = word(p->src);
		fib.ipv4_dst = word(p->dst);
	}
	int host = 1; // NOT_FWDED (local, broadcast, no route), FWD_DISABLED, errors
	switch (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH)) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
	case BPF_FIB_LKUP_RET_UNSUPP_LWT:
	case BPF_FIB_LKUP_RET_BLACKHOLE: // routed, then dropped by the host: not delivered to it
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		host = 0;
	}
	if (a) {
		a->expires = now + ROUTE_CACHE_JIFFIES;
		a->epoch = epoch;
		a->ifindex = ifindex;
		a->family = family;
		a->to_host = host;
		__builtin_memcpy(a->dst, p->dst, 16);
	}
	return host;
}

// to_host says whether the host itself receives a packet to p->dst on
// ifindex rather than forwarding it: the gateway, broadcast, multicast, IPv6
// link-local, and every address the kernel's route lookup does not forward.
static __always_inline int to_host(struct __sk_buff *skb, __u32 ifindex, const struct packet *p, const struct rules *r)
{
	if (p->is6) {
		if (p->dst[0] == 0xff || (p->dst[0] == 0xfe && (p->dst[1] & 0xc0) == 0x80))
			return 1;
		if (equal16(r->gateway_ipv6, p->dst) && !zero16(r->gateway_ipv6))
			return 1;
	} else {
		__u32 dst = word(p->dst);
		if ((p->dst[0] & 0xf0) == 0xe0 || dst == 0xffffffff)
			return 1;
		if (dst && equal4(r->gateway_ipv4, p->dst))
			return 1;
	}
	return routed_to_host(skb, ifindex, p);
}

// in_prefix says whether the first 4*words bytes of a fall in the prefix
// (net, len).
static __always_inline int in_prefix(const __u8 *a, const __u8 *net, __u8 len, int words)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (i >= words)
			break;
		int n = (int)len - 32 * i;
		__u32 mask = n >= 32 ? 0xffffffff : n <= 0 ? 0 : bpf_htonl(0xffffffffu << (32 - n));
		if ((word(a + 4 * i) ^ word(net + 4 * i)) & mask)
			return 0;
	}
	return 1;
}

// own4 and own6 say whether a is an address of the attachment: in one of
// its prefixes.
static __always_inline int own4(const struct rules *r, const __u8 *a)
{
#pragma unroll
	for (int i = 0; i < MAX_PREFIXES; i++)
		if (i < r->n_prefixes4 && in_prefix(a, r->prefixes4[i].addr, r->prefixes4[i].len, 1))
			return 1;
	return 0;
}

static __always_inline int own6(const struct rules *r, const __u8 *a)
{
#pragma unroll
	for (int i = 0; i < MAX_PREFIXES; i++)
		if (i < r->n_prefixes6 && in_prefix(a, r->prefixes6[i].addr, r->prefixes6[i].len, 4))
			return 1;
	return 0;
}

static __always_inline int link_local6(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

// spoofed says whether an IP packet claims to come from somewhere its
// attachment cannot: a source address that is not the attachment's (IPv6
// link-local sources are the VM's own choice and pass; the unspecified
// address passes only where a host without an address sends it: DHCP
// discovery, duplicate address detection, MLD), the gateway's address, or
// a router's or DHCP server's message (router advertisement, redirect, any
// UDP to a DHCP client's port, a neighbor advertisement for an address that
// is not the attachment's).
static __always_inline int spoofed(struct __sk_buff *skb, const struct packet *p, const struct rules *r)
{
	int unspecified;
	if (p->is6) {
		unspecified = zero16(p->src);
		if (!unspecified && !link_local6(p->src) && !own6(r, p->src))
			return 1;
		if (!zero16(r->gateway_ipv6) && equal16(r->gateway_ipv6, p->src))
			return 1;
	} else {
		unspecified = word(p->src) == 0;
		if (!unspecified && !own4(r, p->src))
			return 1;
		if ((p->src[0] & 0xf0) == 0xe0 || word(p->src) == 0xffffffff ||
		    (word(r->gateway_ipv4) && equal4(r->gateway_ipv4, p->src)))
			return 1;
	}
	if (p->fragment == 2)
		return unspecified; // no upper-layer header; the first fragment was checked
	switch (p->l4proto) {
	case IPPROTO_UDP:
		if (p->dport == (p->is6 ? 546 : 68)) // to a DHCP client: a server's message
			return 1;
		return unspecified && (p->is6 || p->sport != 68 || p->dport != 67);
	case IPPROTO_ICMP:
		return unspecified || p->icmp_type == 5 || p->icmp_type == 9; // redirect, router advertisement
	case IPPROTO_ICMPV6:
		if (unspecified) // duplicate address detection; MLD reports and done
			return p->icmp_type != 135 && p->icmp_type != 131 && p->icmp_type != 132 && p->icmp_type != 143;
		if (p->icmp_type == 134 || p->icmp_type == 137) // router advertisement, redirect
			return 1;
		if (p->icmp_type == 136) { // an advertisement for an address that is not the attachment's
			__u8 target[16];
			if (p->l4off + 24 > p->end || load(skb, p->l4off + 8, target, 16) < 0)
				return 1;
			if (!zero16(r->gateway_ipv6) && equal16(target, r->gateway_ipv6))
				return 1;
			return !link_local6(target) && !own6(r, target);
		}
		return 0;
	}
	return unspecified;
}

// decide_arp: ARP is how a VM finds its gateway, so it goes to the host
// whatever the default action (the ethertype list still applies), unless it
// is malformed or spoofed: a sender hardware address that is not the
// frame's source, or a sender IP address that is not the attachment's (0,
// an ARP probe's, passes) or is the gateway's.
static __always_inline __u8 decide_arp(struct __sk_buff *skb, const struct rules *r, int check_spoofing)
{
	struct arp {
		__u8 dst[6], src[6];
		__be16 proto;
		__be16 hrd, pro;
		__u8 hln, pln;
		__be16 op;
		__u8 sha[6], spa[4], tha[6], tpa[4];
	} __attribute__((packed)) a;
	if (load(skb, 0, &a, sizeof(a)) < 0)
		return DECISION_MALFORMED;
	__u16 op = bpf_ntohs(a.op);
	if (a.hrd != bpf_htons(1) || a.pro != bpf_htons(ETH_P_IP) || a.hln != 6 || a.pln != 4 || (op != 1 && op != 2))
		return DECISION_MALFORMED;
	if (check_spoofing) {
		if (word(a.sha) != word(a.src) || a.sha[4] != a.src[4] || a.sha[5] != a.src[5])
			return DECISION_SPOOFED;
		if (word(a.spa) && !own4(r, a.spa))
			return DECISION_SPOOFED;
		if (word(r->gateway_ipv4) && equal4(r->gateway_ipv4, a.spa))
			return DECISION_SPOOFED;
	}
	return DECISION_HOST_ONLY;
}

// fragment_key names p's datagram on ifindex as the kernel's reassembly
// does.
static __always_inline void fragment_key(struct fragment_key *k, __u32 ifindex, const struct packet *p)
{
	k->ifindex = ifindex;
	k->id = p->frag_id;
	k->family = p->is6 ? AF_INET6 : AF_INET;
	k->protocol = p->is6 ? 0 : p->l4proto;
	__builtin_memcpy(k->src, p->src, 16);
	__builtin_memcpy(k->dst, p->dst, 16);
}

// judge_ip applies the rules to an IP packet whose upper layer is known.
// host_port_listed says whether (proto, port) is a host-only port of r.
static __always_inline int host_port_listed(const struct rules *r, __u8 proto, __u16 port)
{
#pragma unroll
	for (int i = 0; i < MAX_HOST_PORTS; i++)
		if (i < r->n_ports && r->ports[i].port == port && r->ports[i].protocol == proto)
			return 1;
	return 0;
}

static __always_inline __u8 judge_ip(struct __sk_buff *skb, __u32 ifindex, const struct rules *pol,
				     const struct packet *p, __u8 *rule)
{
	__u8 proto = p->l4proto;
	*rule = RULE_PROTOCOLS;
	if (pol->n_protocols && !listed8(pol->protocols, pol->n_protocols, proto))
		return DECISION_DENY;
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
		if (pol->default_action != ACTION_ALLOW) {
			// Denied unless it is for the host on a listed port: the
			// route lookup is needed only for a listed port.
			*rule = RULE_DEFAULT;
			if (!host_port_listed(pol, proto, p->dport))
				return DECISION_DENY;
			*rule = RULE_HOST_PORTS;
			return to_host(skb, ifindex, p, pol) ? DECISION_HOST_ONLY : DECISION_DENY;
		}
		*rule = RULE_DEFAULT;
		if (!to_host(skb, ifindex, p, pol))
			return DECISION_ALLOW;
		*rule = RULE_HOST_PORTS;
		return host_port_listed(pol, proto, p->dport) ? DECISION_HOST_ONLY : DECISION_DENY;
	}
	if (proto == (p->is6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP)) {
		// Router solicitation, neighbor solicitation and advertisement
		// for the host: how a VM finds its gateway.
		__u8 t = p->icmp_type;
		*rule = RULE_ND;
		if (p->is6 && (t == 133 || t == 135 || t == 136) && to_host(skb, ifindex, p, pol))
			return DECISION_HOST_ONLY;
		// Any other ICMP, to the host or not, follows the default action.
		*rule = RULE_ICMP;
		return by_default(pol);
	}
	// No other protocol reaches the host: it offers tenants ports only.
	*rule = RULE_DEFAULT;
	if (pol->default_action != ACTION_ALLOW)
		return DECISION_DENY;
	*rule = RULE_HOST_PROTOCOLS;
	if (to_host(skb, ifindex, p, pol))
		return DECISION_DENY;
	*rule = RULE_DEFAULT;
	return DECISION_ALLOW;
}

static __always_inline __u8 decide(struct __sk_buff *skb, __u32 ifindex, const struct rules *pol, __u8 *rule)
{
	__u16 proto = bpf_ntohs(skb->protocol);
	// The kernel strips one VLAN tag before TCX runs; a tag still there
	// means a frame of two or more, whose IP the kernel would find behind
	// them once the program let it through. Such frames are denied.
	*rule = RULE_VLAN;
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD)
		return DECISION_DENY;
	*rule = RULE_ETHERTYPES;
	if (pol->n_ethertypes && !listed16(pol->ethertypes, pol->n_ethertypes, proto))
		return DECISION_DENY;
	struct headers h = {}; // zeroed: the verifier, unprivileged, refuses reads of stack never written
	int ip_read = 0;
	if (proto == ETH_P_IP && load(skb, 0, &h.eth, ETH_HLEN + sizeof(h.v4)) == 0)
		ip_read = 1;
	else if (proto == ETH_P_IPV6 && load(skb, 0, &h.eth, ETH_HLEN + sizeof(h.v6)) == 0)
		ip_read = 1;
	else if (load(skb, 0, &h.eth, ETH_HLEN) < 0) {
		*rule = RULE_MALFORMED;
		return DECISION_MALFORMED;
	}
	int check_spoofing = !(pol->flags & POLICY_SPOOFING_ALLOWED);
	*rule = RULE_SPOOFED_MAC;
	if (check_spoofing) {
		const __u8 *src = h.eth.h_source;
		if (src[0] & 1) // a group address is no frame's source
			return DECISION_SPOOFED;
		__u32 mac_hi = word(pol->mac);
		__u16 mac_lo = (__u16)pol->mac[4] << 8 | pol->mac[5];
		__u16 src_lo = (__u16)src[4] << 8 | src[5];
		if ((mac_hi || mac_lo) && (word(src) != mac_hi || src_lo != mac_lo))
			return DECISION_SPOOFED;
	}
	*rule = RULE_ARP;
	if (proto == ETH_P_ARP)
		return decide_arp(skb, pol, check_spoofing);

	struct packet p = {};
	*rule = RULE_MALFORMED;
	if (proto == ETH_P_IP) {
		if (parse_ipv4(skb, &p, &h, ip_read) < 0)
			return DECISION_MALFORMED;
	} else if (proto == ETH_P_IPV6) {
		if (parse_ipv6(skb, &p, &h, ip_read) < 0)
			return DECISION_MALFORMED;
	} else {
		*rule = RULE_NON_IP;
		return by_default(pol);
	}

	if (p.fragment == 2) {
		*rule = RULE_SPOOFED_IP;
		if (check_spoofing && spoofed(skb, &p, pol))
			return DECISION_SPOOFED;
		*rule = RULE_FRAGMENTS;
		// No upper-layer header here: the fragment gets the decision on
		// its datagram's first fragment, or is denied when none was seen.
		// The last fragment takes the datagram's state with it.
		void *frags = bpf_map_lookup_elem(&tap_fragments, &ifindex);
		if (!frags)
			return DECISION_DENY;
		struct fragment_key k = {};
		fragment_key(&k, ifindex, &p);
		__u8 *first = bpf_map_lookup_elem(frags, &k);
		if (!first)
			return DECISION_DENY;
		__u8 d = *first;
		if (p.last_fragment)
			bpf_map_delete_elem(frags, &k);
		return d;
	}
	__u8 d;
	if (parse_l4(skb, &p) < 0) {
		d = DECISION_MALFORMED;
	} else if (check_spoofing && spoofed(skb, &p, pol)) {
		*rule = RULE_SPOOFED_IP;
		d = DECISION_SPOOFED;
	} else {
		d = judge_ip(skb, ifindex, pol, &p, rule);
	}
	if (p.fragment == 1) {
		void *frags = bpf_map_lookup_elem(&tap_fragments, &ifindex);
		if (frags) {
			struct fragment_key k = {};
			fragment_key(&k, ifindex, &p);
			bpf_map_update_elem(frags, &k, &d, BPF_ANY);
		}
	}
	return d;
}

// read_rules copies the interface's rules out under their lock, so that a
// frame is judged by one complete version, and checks that they are its own:
// a hash element removed under a reader goes back to the map's free list
// and may carry another interface's rules by the time it is read. The
// remover zeroes the rules (under the lock) before deleting them, so a
// recycled element never names ifindex. The copy goes to this CPU's scratch
// slot, not the stack, which the rest of the program needs: TCX runs with
// bottom halves off, so nothing else on the CPU uses the slot meanwhile.
static __always_inline struct rules *read_rules(__u32 ifindex)
{
	__u32 zero = 0;
	struct rules *out = bpf_map_lookup_elem(&rules_scratch, &zero);
	struct tap_rules *t = bpf_map_lookup_elem(&tap_rules, &ifindex);
	if (!out || !t)
		return 0;
	bpf_spin_lock(&t->lock);
	__builtin_memcpy(out, &t->rules, sizeof(*out));
	bpf_spin_unlock(&t->lock);
	return out->ifindex == ifindex ? out : 0;
}

SEC("tcx/ingress")
int tap_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct rules *r = read_rules(ifindex);
	if (!r) {
		count_unattributed(REASON_POLICY_UNAVAILABLE);
		record_drop(skb, ifindex, 0, 0, DROP_NO_RULES, RULE_NO_RULES);
		return GALACTIC_TCX_DROP;
	}
	__u8 rule = 0;
	__u8 d = decide(skb, ifindex, r, &rule);
	count_decision(r, d);
	count_total(d);
	if (d == DECISION_ALLOW || d == DECISION_HOST_ONLY)
		return GALACTIC_TCX_NEXT;
	record_drop(skb, ifindex, r->vpc, r->attachment, d, rule);
	return GALACTIC_TCX_DROP;
}

char __license[] SEC("license") = "Dual BSD/GPL";

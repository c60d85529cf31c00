// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The TCX ingress program of tenant taps and the maps it reads. Every
// per-interface map is keyed by the ingress ifindex (host_only_port by a key
// that starts with it); node/attachreg is the one place that writes and
// removes those rows. Layouts here are mirrored by types.go; a test compares
// the sizes against this object's BTF.

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

#define MAX_INTERFACES 65536
#define MAX_ETHERTYPES 8
#define MAX_PROTOCOLS 8

enum action { ACTION_ALLOW = 0, ACTION_DENY = 1 };
enum decision { DECISION_ALLOW = 0, DECISION_DENY = 1, DECISION_HOST_ONLY = 2 };
enum reason { REASON_POLICY_UNAVAILABLE = 0, REASON_IDENTITY_UNAVAILABLE = 1, REASON_MAX = 4 };
enum egress { EGRESS_TAP = 1, EGRESS_VETH = 2 };

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
	__u8 _pad;
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

struct decision_key {
	__u64 vpc;
	__u16 attachment;
	__u8 decision;
	__u8 _pad[5];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INTERFACES);
	__type(key, __u32);
	__type(value, struct vrf_binding);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ifindex_vrf SEC(".maps");

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

static __always_inline void count_unattributed(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&unattributed, &reason);
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void count_decision(const struct vrf_binding *vb, __u8 decision)
{
	struct decision_key key = {.vpc = vb->vpc, .attachment = vb->attachment, .decision = decision};
	__u64 *n = bpf_map_lookup_elem(&decisions, &key);
	if (!n) {
		__u64 zero = 0;
		bpf_map_update_elem(&decisions, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&decisions, &key);
		if (!n)
			return;
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

static __always_inline int is_zero(const __u8 *b, int len)
{
	for (int i = 0; i < len; i++)
		if (b[i])
			return 0;
	return 1;
}

static __always_inline int equal(const __u8 *a, const __u8 *b, int len)
{
	for (int i = 0; i < len; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

static __always_inline __u8 decide(struct __sk_buff *skb, __u32 ifindex, const struct traffic_policy *pol)
{
	__u16 proto = bpf_ntohs(skb->protocol);
	if (pol->n_ethertypes && !listed16(pol->ethertypes, pol->n_ethertypes, proto))
		return DECISION_DENY;

	__u8 l4proto = 0, dst[16] = {};
	__u32 l4off = 0;
	int is6 = 0;
	if (proto == ETH_P_IP) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return DECISION_DENY;
		l4proto = ip.protocol;
		__builtin_memcpy(dst, &ip.daddr, 4);
		l4off = ETH_HLEN + ip.ihl * 4;
	} else if (proto == ETH_P_IPV6) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return DECISION_DENY;
		l4proto = ip6.nexthdr;
		__builtin_memcpy(dst, &ip6.daddr, 16);
		l4off = ETH_HLEN + sizeof(ip6);
		is6 = 1;
	} else {
		return pol->default_action == ACTION_ALLOW ? DECISION_ALLOW : DECISION_DENY;
	}

	if (pol->n_protocols && !listed8(pol->protocols, pol->n_protocols, l4proto))
		return DECISION_DENY;

	struct gateway *gw = bpf_map_lookup_elem(&tenant_gateway, &ifindex);
	if (gw && (l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP)) {
		int to_gateway = is6 ? (!is_zero(gw->ipv6, 16) && equal(gw->ipv6, dst, 16))
				     : (!is_zero(gw->ipv4, 4) && equal(gw->ipv4, dst, 4));
		if (to_gateway) {
			__be16 port;
			if (bpf_skb_load_bytes(skb, l4off + 2, &port, sizeof(port)) < 0)
				return DECISION_DENY;
			struct host_port_key key = {.ifindex = ifindex, .port = bpf_ntohs(port), .protocol = l4proto};
			__u8 *allowed = bpf_map_lookup_elem(&host_only_port, &key);
			return allowed && *allowed ? DECISION_HOST_ONLY : DECISION_DENY;
		}
	}
	return pol->default_action == ACTION_ALLOW ? DECISION_ALLOW : DECISION_DENY;
}

SEC("tcx/ingress")
int tap_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	struct traffic_policy *pol = bpf_map_lookup_elem(&traffic_policy, &ifindex);
	if (!pol) {
		count_unattributed(REASON_POLICY_UNAVAILABLE);
		return GALACTIC_TCX_DROP;
	}
	struct vrf_binding *vb = bpf_map_lookup_elem(&ifindex_vrf, &ifindex);
	if (!vb) {
		count_unattributed(REASON_IDENTITY_UNAVAILABLE);
		return GALACTIC_TCX_DROP;
	}
	__u8 d = decide(skb, ifindex, pol);
	count_decision(vb, d);
	return d == DECISION_DENY ? GALACTIC_TCX_DROP : GALACTIC_TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The contract between the sk_lookup router and user space.
 *
 * Every layout here is mirrored, field for field, by
 * plugins/module_utils/dataplane/route_codec.py and described in docs/dataplane.md.
 * Change the three together, and only in ways that keep pinned maps readable:
 * a router upgrade reuses the pinned maps of the running version.
 */
#ifndef ZEROLAYER_ROUTER_H
#define ZEROLAYER_ROUTER_H

#include <linux/types.h>

#define ZL_ROUTE_NAME_LEN 32  /* NUL-padded route name, at most 31 bytes */
#define ZL_MAX_ROUTES 64      /* route indexes 0..63 */
#define ZL_MAX_SLOTS 8        /* engine sockets per route (e.g. one per GPU) */
#define ZL_WEIGHT_SCALE 10000 /* weights are basis points: 10000 = 100% */
#define ZL_LATENCY_BUCKETS 64 /* log2 buckets of decision time in ns */
/*
 * One decision in 2^ZL_LATENCY_SAMPLE_SHIFT is timed into zl_latency: reading the
 * clock twice costs more than the decision itself (on the reference VM about 90 ns
 * against 40 ns for an untimed decision at weight 100; bench/decision_cost.py).
 * Which ones is a function of the 4-tuple: the top bits of the weight hash are 0.
 */
#define ZL_LATENCY_SAMPLE_SHIFT 4
/*
 * The layout of the pinned maps. 1: the first release (four maps, constant seeds).
 * 2: adds zl_config (the node's own seeds and this number), zl_families and
 *    zl_weights (the weight leaves zl_route, so a rollback is one blind write).
 * 3: adds the cohorts: zl_cohorts_v4, zl_cohorts_v6 (client sets by source CIDR) and
 *    zl_cohort_ctrs; the high bit of a zl_weights value enables the opt-in cohort.
 * 4: adds zl_clients (the addresses a hash-by-client route decided) and gives the route
 *    entry a flags word (the former legacy_weight_bp): ZL_ROUTE_HASH_CLIENT.
 * User space refuses pins whose layout it does not know (route_codec.MAP_SPECS).
 */
#define ZL_LAYOUT_VERSION 4
/* Bits of a zl_families value: the address families a slot's socket can take. */
#define ZL_TAKES_IPV4 1
#define ZL_TAKES_IPV6 2

/* zl_routes: BPF_MAP_TYPE_HASH, key __u32 local port (host order). */
struct zl_route {
	char name[ZL_ROUTE_NAME_LEN];
	__u32 port;        /* same as the key; kept for readers of the value alone */
	/*
	 * Layout 1: the route's weight in basis points. Since layout 2 the weight is in
	 * zl_weights; since layout 4 the high 16 bits are ZL_ROUTE_* flags. The low 16 bits
	 * are never read: a route written by layout 1 and not rewritten since may still hold
	 * its old weight there (at most 10000), and that must not read as a flag.
	 */
	__u32 flags;
	__u64 generation;  /* bumped by user space on every write of this entry */
	__u32 route_index; /* selects the sockets slots and the counters of this route */
	/*
	 * Sockets live only in slots below this (user space keeps it one above the
	 * highest registered slot), so a route with one engine looks at one slot, not
	 * ZL_MAX_SLOTS. 0: not known (or no socket), look at every slot. Too high only
	 * costs lookups; user space raises it after inserting a socket, lowers it after
	 * removing one.
	 */
	__u32 slot_limit;
};

/*
 * The route hashes the client's address alone, not the 4-tuple (route option hash: client):
 * every connection of one client takes one path at a given weight, and one engine socket
 * among several. Set only while the pinned program uses zl_clients (a layout 3 program
 * would not read it, and would hash by connection without a word).
 */
#define ZL_ROUTE_HASH_CLIENT 0x00010000u
/*
 * The route has no entry in either cohort trie: the program skips the trie and looks up no
 * cohort counter, so a route without cohorts decides as it did before them. Set by user space
 * only while the route's lists are empty and the pinned program reads the flags word (a
 * layout 1 program would read the bit as a weight); a route without the bit (written before
 * it existed) is looked up as before, which is the safe side. User space turns the trie on
 * (clears the bit) no later than the weight word that makes new entries apply, and off only
 * with the write after which no entry applies.
 */
#define ZL_ROUTE_NO_COHORTS 0x00020000u

/*
 * zl_sockets: BPF_MAP_TYPE_SOCKMAP, key __u32, value __u64 (the socket cookie
 * when read from user space, an fd when written).
 * Slot s of route r lives at key r * ZL_MAX_SLOTS + s.
 */
static inline __u32 zl_socket_key(__u32 route_index, __u32 slot)
{
	return route_index * ZL_MAX_SLOTS + slot;
}

/*
 * zl_families: BPF_MAP_TYPE_ARRAY, key as zl_sockets, value __u32 ZL_TAKES_* bits of
 * the socket in that slot: an IPv4 socket takes IPv4, a v6-only one IPv6, a dual-stack
 * one both. Written before the socket is inserted. 0 (a socket registered by layout 1)
 * means not known: any family may try, and a refusal counts as an assign error.
 */

/*
 * zl_config: BPF_MAP_TYPE_ARRAY, one entry (key 0). Written once, when the maps are
 * made, from the kernel's random source: two nodes decide differently for the same
 * tuple, and no client can pick source ports that always reach (or avoid) the engine.
 * A program upgrade reuses the maps, so every tuple keeps its path across it.
 */
struct zl_config {
	__u32 layout_version; /* ZL_LAYOUT_VERSION of the code that made the maps */
	__u32 reserved;       /* 0 */
	__u64 seed_weight;    /* seeds the hash that picks the path */
	__u64 seed_slot;      /* seeds the hash that picks among several engine sockets */
};

/*
 * zl_weights: BPF_MAP_TYPE_ARRAY, key __u32 route index, value __u32 weight in basis
 * points (0..10000): the share of the route's new connections sent to the engine.
 * Its own map so that setting a weight is one update of 4 bytes, with no read first:
 * a fast rollback writes 0 everywhere without waiting for any other writer.
 *
 * Since layout 3 the word's high bit (ZL_WEIGHT_OPT_IN) enables the route's opt-in
 * cohort (its always_direct entries) and the low bits (ZL_WEIGHT_BP_MASK) hold the
 * weight: the 0 a rollback writes, blind, clears the weight and the opt-in cohort in one
 * write. Only user space that knows layout 3 sets the bit (a layout 2 program would read
 * it as a weight).
 */
#define ZL_WEIGHT_OPT_IN 0x80000000u
#define ZL_WEIGHT_BP_MASK 0x0000ffffu

/*
 * zl_cohorts_v4 / zl_cohorts_v6: BPF_MAP_TYPE_LPM_TRIE (BPF_F_NO_PREALLOC), at most
 * ZL_MAX_COHORT_ENTRIES entries each. The route index comes before the address in the
 * key, so one trie serves every route: prefixlen counts the 32 bits of the route index
 * and then the CIDR's prefix length (32 + 24 for 10.0.0.0/24 on any route). The value is
 * a __u32 ZL_COHORT_* (which set the CIDR is in). A lookup with the client's full address
 * finds the longest prefix of that route only.
 */
#define ZL_MAX_COHORT_ENTRIES 1024
#define ZL_COHORT_ALWAYS_DIRECT 1 /* opt-in: the engine at any weight (bit set in zl_weights) */
#define ZL_COHORT_NEVER_DIRECT 2  /* opt-out: the proxy at any weight */

struct zl_cohort_key_v4 {
	__u32 prefixlen;   /* 32 (route index) + the CIDR's prefix length */
	__u32 route_index; /* host order; always matched whole */
	__u8 addr[4];      /* network order */
};

struct zl_cohort_key_v6 {
	__u32 prefixlen;
	__u32 route_index;
	__u8 addr[16];
};

/*
 * zl_cohort_ctrs: BPF_MAP_TYPE_PERCPU_ARRAY, key __u32 route index (layout 3; a map of
 * its own so that zl_counters keeps the size old pins have).
 */
struct zl_cohort_counters {
	__u64 to_engine_opt_in;  /* opt-in clients assigned to an engine (also in to_engine) */
	__u64 to_proxy_opt_out;  /* opt-out clients left to the proxy (in no zl_counters field) */
};

/*
 * zl_clients: BPF_MAP_TYPE_LRU_HASH, at most ZL_MAX_CLIENTS entries (layout 4). For routes
 * that hash by client only: the path the weight gave each client address, so user space can
 * count addresses (the canary's measured split is then a split of addresses, not of
 * connections). The program looks the address up and writes only when the entry differs,
 * so a client's steady state costs one lookup. Clients of a cohort are not noted: their
 * path does not depend on the weight. The least recently seen addresses make room.
 */
#define ZL_MAX_CLIENTS 65536

struct zl_client_key {
	__u32 route_index;
	__u32 family;  /* AF_INET or AF_INET6, as in the sk_lookup context */
	__u8 addr[16]; /* network order; an IPv4 address in the first 4 bytes, the rest 0 */
};

struct zl_client_seen {
	__u32 weight_word; /* the route's zl_weights value the decision was made with */
	__u32 direct;      /* 1: assigned to an engine socket, 0: left to the proxy */
};

/* zl_counters: BPF_MAP_TYPE_PERCPU_ARRAY, key __u32 route index. */
struct zl_counters {
	__u64 lookups;            /* TCP lookups on the route's port */
	__u64 to_engine;          /* connections assigned to an engine socket */
	__u64 to_proxy_by_weight; /* the hash fell outside the weight */
	__u64 fallback_no_socket; /* engine path chosen, but no live socket in any slot */
	__u64 assign_errors;      /* bpf_sk_assign refused the socket */
};

/*
 * zl_latency: BPF_MAP_TYPE_PERCPU_ARRAY, key __u32 bucket, value __u64 count.
 * Bucket b counts timed decisions (see ZL_LATENCY_SAMPLE_SHIFT) that took
 * [2^b, 2^(b+1)) ns; bucket 0 also holds 0 ns.
 */

#endif

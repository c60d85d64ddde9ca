// SPDX-License-Identifier: GPL-2.0
/*
 * sk_lookup router: for each new TCP connection to a routed local port, either
 * leave the choice to the kernel (the proxy bound to the port gets it) or hand
 * the connection to a model engine's own listening socket.
 *
 * The choice is a pure function of the connection's 4-tuple (of the client's address
 * alone on a route that hashes by client), the route's weight and cohorts
 * (zl_cohorts_v4/v6) and the node's seeds (zl_config). It must be: with SYN cookies the
 * final ACK runs this lookup again and has to land on the same socket as the SYN did.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "zerolayer_router.h"

#ifndef IPPROTO_TCP
#define IPPROTO_TCP 6
#endif
#ifndef AF_INET
#define AF_INET 2
#endif

/*
 * Changes the program's instructions, hence its tag, without changing what it
 * decides: lets a build be told apart from another one (and tests exercise a
 * real program upgrade).
 */
#ifndef ZL_BUILD_STAMP
#define ZL_BUILD_STAMP 0
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ZL_MAX_ROUTES);
	__type(key, __u32);
	__type(value, struct zl_route);
} zl_routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, ZL_MAX_ROUTES * ZL_MAX_SLOTS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u64));
} zl_sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZL_MAX_ROUTES);
	__type(key, __u32);
	__type(value, struct zl_counters);
} zl_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZL_LATENCY_BUCKETS);
	__type(key, __u32);
	__type(value, __u64);
} zl_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct zl_config);
} zl_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ZL_MAX_ROUTES * ZL_MAX_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} zl_families SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ZL_MAX_ROUTES);
	__type(key, __u32);
	__type(value, __u32);
} zl_weights SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, ZL_MAX_COHORT_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct zl_cohort_key_v4);
	__type(value, __u32);
} zl_cohorts_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, ZL_MAX_COHORT_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct zl_cohort_key_v6);
	__type(value, __u32);
} zl_cohorts_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZL_MAX_ROUTES);
	__type(key, __u32);
	__type(value, struct zl_cohort_counters);
} zl_cohort_ctrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, ZL_MAX_CLIENTS);
	__type(key, struct zl_client_key);
	__type(value, struct zl_client_seen);
} zl_clients SEC(".maps");

/* splitmix64's finaliser: every input bit moves about half the output bits. */
static __always_inline __u64 zl_mix(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

static __always_inline __u64 zl_tuple_hash(const struct bpf_sk_lookup *ctx, __u64 seed)
{
	__u64 h = seed;

	if (ctx->family == AF_INET) {
		h = zl_mix(h ^ ctx->remote_ip4);
		h = zl_mix(h ^ ctx->local_ip4);
	} else {
		h = zl_mix(h ^ ((__u64)ctx->remote_ip6[0] << 32 | ctx->remote_ip6[1]));
		h = zl_mix(h ^ ((__u64)ctx->remote_ip6[2] << 32 | ctx->remote_ip6[3]));
		h = zl_mix(h ^ ((__u64)ctx->local_ip6[0] << 32 | ctx->local_ip6[1]));
		h = zl_mix(h ^ ((__u64)ctx->local_ip6[2] << 32 | ctx->local_ip6[3]));
	}
	h = zl_mix(h ^ ((__u64)ctx->remote_port << 16 | ctx->local_port));
	return h;
}

/*
 * The client's address alone (route flag ZL_ROUTE_HASH_CLIENT): every connection of one
 * client hashes the same, so it takes one path and one engine socket. Seeded like the
 * 4-tuple hash, so no client can tell in advance which path its address gets.
 */
static __always_inline __u64 zl_client_hash(const struct bpf_sk_lookup *ctx, __u64 seed)
{
	__u64 h;

	if (ctx->family == AF_INET)
		return zl_mix(seed ^ ctx->remote_ip4);
	h = zl_mix(seed ^ ((__u64)ctx->remote_ip6[0] << 32 | ctx->remote_ip6[1]));
	return zl_mix(h ^ ((__u64)ctx->remote_ip6[2] << 32 | ctx->remote_ip6[3]));
}

static __always_inline __u32 zl_log2(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

static __always_inline void zl_record_latency(__u64 started_ns)
{
	__u32 bucket = zl_log2(bpf_ktime_get_ns() - started_ns);
	__u64 *count = bpf_map_lookup_elem(&zl_latency, &bucket);

	if (count)
		*count += 1;
}

/* Slots of the route that may hold a socket: 0..limit-1. */
static __always_inline __u32 zl_slot_limit(const struct zl_route *route)
{
	__u32 limit = route->slot_limit;

	return limit == 0 || limit > ZL_MAX_SLOTS ? ZL_MAX_SLOTS : limit;
}

/*
 * The socket in one slot if it is live and can take the connection's family (a
 * reference to release), else NULL. Sockets of another family are not candidates at
 * all: one v4 and one v6 socket on a route must not send half of each family's
 * engine-path connections to a socket that refuses them.
 */
static __always_inline struct bpf_sock *zl_usable_socket(__u32 key, __u32 wanted_family)
{
	struct bpf_sock *sk = bpf_map_lookup_elem(&zl_sockets, &key);
	__u32 *families;

	if (!sk)
		return NULL;
	families = bpf_map_lookup_elem(&zl_families, &key);
	if (families && *families && !(*families & wanted_family)) {
		bpf_sk_release(sk);
		return NULL;
	}
	return sk;
}

/*
 * Counts the usable sockets among the route's first limit slots and keeps a
 * reference to the first one (NULL when none is): with one engine, the usual case,
 * that is the answer and no second pass is needed.
 */
static __always_inline __u32 zl_live_slots(__u32 route_index, __u32 limit,
					   __u32 wanted_family, struct bpf_sock **first)
{
	__u32 live = 0;

	*first = NULL;
	for (__u32 slot = 0; slot < ZL_MAX_SLOTS; slot++) {
		struct bpf_sock *sk;

		if (slot >= limit)
			break;
		sk = zl_usable_socket(zl_socket_key(route_index, slot), wanted_family);
		if (!sk)
			continue;
		live++;
		if (*first)
			bpf_sk_release(sk);
		else
			*first = sk;
	}
	return live;
}

/* Returns the nth usable socket among the first limit slots (a reference to release), or NULL. */
static __always_inline struct bpf_sock *zl_nth_live_socket(__u32 route_index, __u32 limit,
							   __u32 wanted_family, __u32 nth)
{
	for (__u32 slot = 0; slot < ZL_MAX_SLOTS; slot++) {
		struct bpf_sock *sk;

		if (slot >= limit)
			break;
		sk = zl_usable_socket(zl_socket_key(route_index, slot), wanted_family);
		if (!sk)
			continue;
		if (nth == 0)
			return sk;
		nth--;
		bpf_sk_release(sk);
	}
	return NULL;
}

/* The cohort the client's address is in on this route: ZL_COHORT_*, or 0 for none. */
static __always_inline __u32 zl_cohort(const struct bpf_sk_lookup *ctx, __u32 index)
{
	__u32 *set;

	if (ctx->family == AF_INET) {
		struct zl_cohort_key_v4 key = { .prefixlen = 64, .route_index = index };

		__builtin_memcpy(key.addr, &ctx->remote_ip4, 4);
		set = bpf_map_lookup_elem(&zl_cohorts_v4, &key);
	} else {
		struct zl_cohort_key_v6 key = { .prefixlen = 160, .route_index = index };
		__u32 ip6[4] = { ctx->remote_ip6[0], ctx->remote_ip6[1], ctx->remote_ip6[2],
				 ctx->remote_ip6[3] };

		__builtin_memcpy(key.addr, ip6, 16);
		set = bpf_map_lookup_elem(&zl_cohorts_v6, &key);
	}
	return set ? *set : 0;
}

/*
 * Notes the path the weight gave a client of a hash-by-client route, with the weight word
 * it was decided with, in zl_clients: user space counts addresses per path at the current
 * weight. Writes only when the entry differs, so a known client costs one lookup.
 */
static __always_inline void zl_note_client(const struct bpf_sk_lookup *ctx, __u32 index,
					   __u32 weight_word, __u32 direct)
{
	struct zl_client_seen seen = { .weight_word = weight_word, .direct = direct };
	struct zl_client_key key = { .route_index = index, .family = ctx->family };
	struct zl_client_seen *known;

	if (ctx->family == AF_INET) {
		__builtin_memcpy(key.addr, &ctx->remote_ip4, 4);
	} else {
		__u32 ip6[4] = { ctx->remote_ip6[0], ctx->remote_ip6[1], ctx->remote_ip6[2],
				 ctx->remote_ip6[3] };

		__builtin_memcpy(key.addr, ip6, 16);
	}
	known = bpf_map_lookup_elem(&zl_clients, &key);
	if (known && known->weight_word == weight_word && known->direct == direct)
		return;
	bpf_map_update_elem(&zl_clients, &key, &seen, BPF_ANY);
}

/* Times a sample of decisions only: the clock costs more than the decision. */
static __always_inline int zl_timed(__u64 weight_hash)
{
	return (weight_hash >> (64 - ZL_LATENCY_SAMPLE_SHIFT)) == 0;
}

SEC("sk_lookup")
int zerolayer_router(struct bpf_sk_lookup *ctx)
{
	struct zl_cohort_counters *cohort_counters;
	struct zl_counters *counters;
	struct zl_config *config;
	struct zl_route *route;
	__u32 *weight_bp;
	__u64 weight_hash, decision_hash, started_ns = 0;
	struct bpf_sock *sk;
	__u32 port, index, limit, live, nth, wanted_family, weight_word, cohort, config_key = 0;
	__u32 direct = 0;
	int timed, by_client = 0, note_client = 0, opt_in = 0;

	asm volatile("r0 = %[stamp]" : : [stamp] "i"(ZL_BUILD_STAMP) : "r0");

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	/* The route first: a port with no route pays one lookup and no hash. */
	port = ctx->local_port;
	route = bpf_map_lookup_elem(&zl_routes, &port);
	if (!route)
		return SK_PASS;
	config = bpf_map_lookup_elem(&zl_config, &config_key);
	if (!config)
		return SK_PASS;
	/* The sample of timed decisions stays one of connections, whatever the route hashes. */
	weight_hash = zl_tuple_hash(ctx, config->seed_weight);
	timed = zl_timed(weight_hash);
	if (timed)
		started_ns = bpf_ktime_get_ns();
	index = route->route_index;
	counters = bpf_map_lookup_elem(&zl_counters, &index);
	weight_bp = bpf_map_lookup_elem(&zl_weights, &index);
	if (!counters || !weight_bp || index >= ZL_MAX_ROUTES)
		return SK_PASS;
	counters->lookups++;

	/*
	 * The decision order: the opt-out cohort (never_direct) wins over the opt-in cohort
	 * (always_direct, only while the weight word's opt-in bit is set), which wins over
	 * the weight's hash (of the 4-tuple, or of the client's address on a route that
	 * hashes by client). Each is a function of the connection and the maps, as before.
	 */
	weight_word = *weight_bp;
	/* A route without cohorts pays neither the trie nor the cohort counters. */
	cohort = route->flags & ZL_ROUTE_NO_COHORTS ? 0 : zl_cohort(ctx, index);
	if (cohort == ZL_COHORT_NEVER_DIRECT) {
		cohort_counters = bpf_map_lookup_elem(&zl_cohort_ctrs, &index);
		if (cohort_counters)
			cohort_counters->to_proxy_opt_out++;
		goto out;
	}
	opt_in = cohort == ZL_COHORT_ALWAYS_DIRECT && (weight_word & ZL_WEIGHT_OPT_IN);
	by_client = (route->flags & ZL_ROUTE_HASH_CLIENT) != 0;
	decision_hash = by_client ? zl_client_hash(ctx, config->seed_weight) : weight_hash;
	/* Only clients the weight decides are noted: a cohort's path does not depend on it. */
	note_client = by_client && !opt_in;
	if (!opt_in && decision_hash % ZL_WEIGHT_SCALE >= (weight_word & ZL_WEIGHT_BP_MASK)) {
		counters->to_proxy_by_weight++;
		goto out;
	}

	wanted_family = ctx->family == AF_INET ? ZL_TAKES_IPV4 : ZL_TAKES_IPV6;
	limit = zl_slot_limit(route);
	live = zl_live_slots(index, limit, wanted_family, &sk);
	if (!sk)
		goto no_socket;
	if (live > 1)
		nth = (by_client ? zl_client_hash(ctx, config->seed_slot)
				 : zl_tuple_hash(ctx, config->seed_slot)) % live;
	else
		nth = 0;
	if (nth) {
		bpf_sk_release(sk);
		sk = zl_nth_live_socket(index, limit, wanted_family, nth);
		if (!sk)
			goto no_socket;
	}
	if (bpf_sk_assign(ctx, sk, 0) == 0) {
		counters->to_engine++;
		direct = 1;
		if (opt_in) {
			cohort_counters = bpf_map_lookup_elem(&zl_cohort_ctrs, &index);
			if (cohort_counters)
				cohort_counters->to_engine_opt_in++;
		}
	} else
		counters->assign_errors++;
	bpf_sk_release(sk);
	goto out;
no_socket:
	/* Raced with an engine going away, or none registered: the proxy takes it. */
	counters->fallback_no_socket++;
out:
	if (note_client)
		zl_note_client(ctx, index, weight_word, direct);
	if (timed)
		zl_record_latency(started_ns);
	return SK_PASS;
}

char _license[] SEC("license") = "GPL";

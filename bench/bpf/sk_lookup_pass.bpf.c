// SPDX-License-Identifier: GPL-2.0
/*
 * The bench's floor: an sk_lookup program that decides nothing. What the kernel
 * counts for it per run (run_time_ns / run_cnt) is the cost of running any
 * sk_lookup program with BPF_ENABLE_STATS on, which the router's figure includes.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("sk_lookup")
int sk_lookup_pass(struct bpf_sk_lookup *ctx)
{
	return SK_PASS;
}

char _license[] SEC("license") = "GPL";

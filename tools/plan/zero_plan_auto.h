#pragma once
// zero_plan's strategy mode (parallel/strategy/): every layout of a model on a cluster, ranked.
//
//   zero_plan --auto --gpt L,C,H[,V,T] --batch B --cluster CLUSTER.json [--world N] [--dtype fp32|bf16]
//             [--top K] [--svg FILE] [--list] [--tp N] [--pp N]
//   zero_plan --auto --model MODEL.json ...   (a model description: parallel/strategy/described_model.h)
//   zero_plan --auto --hf-config config.json [--seq-len T] ...   (a LLaMA-family model: hf_llama.h)
//   zero_plan --auto --megatron L,C,H,V,T ...   (Megatron-LM's GPT as its papers count it: megatron_gpt.h)
//   zero_plan --explain "dp=2,tp=2,pp=2,stage=3,m=4,schedule=1f1b" --gpt ... --batch B --cluster ...
//   zero_plan --describe --gpt L,C,H[,V,T] | --hf-config config.json [--seq-len T] > MODEL.json
//                                                          (the model's description, to edit)
//   zero_plan --auto ... [--config BASE.json] --write-config RUN.json   (the first choice, to run)
//
// --config BASE.json: the engine options to plan with (ours or DeepSpeed's: the optimizer, dtypes,
// buckets and windows; its model_dtype and loop.global_batch_size stand in for --dtype and --batch);
// without it, train_gpt's. --write-config RUN.json (with --auto: the first choice; with --explain: that
// layout) writes what the plan runs in our format (docs/config.md): those options with the layout's
// stage, offload and micro-batches, the model dtype, the global batch and the parallel section
// (dp, tp, sequence_parallel, pp, schedule, chunks, recompute); train_gpt --config RUN.json runs it.
//
// --world defaults to the cluster's devices; --dtype (the parameters') to fp32 for --gpt (train_gpt's)
// and bf16 for --model, --hf-config and --megatron (fp16 also for those). The table lists the layouts that fit first, fastest
// first (memory per rank by category, predicted step time, tokens/s, bubble, exposed data-parallel
// communication), then those that do not, smallest first; a line says why the first is chosen. Only
// the first K (default 20) are planned exactly: a layout whose time floor cannot rank among them is
// listed by that floor ("slower (at least)"), which keeps a search over thousands of layouts short.
// --tp and --pp keep only the layouts of that degree (a published layout's best, beside the choice).
// --svg (which plans every layout) draws time against memory with the frontier; --list plans every
// layout and prints one tab-separated line per layout for scripts (key, train_gpt flags ("-" for a
// model other than --gpt), ranks, predicted ms, device bytes of the largest stage, the largest
// activation peak of any stage in bytes, fits).
#include "tools/cli/flags.h"

namespace zero {

int run_strategy(cli::Flags& flags);

}  // namespace zero

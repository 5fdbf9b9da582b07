"""
Mutation check: break one mechanism of the paper at a time and see whether the tests notice.

Each entry of MUTATIONS is one semantic mutation: the file, the exact code, its broken version and the
tests that should fail (pytest node ids, or "FILE -k EXPR"). For each, the repository is copied into a
scratch folder (tempfile; the working tree is never touched), the code is replaced there, and the tests
run with `python -m pytest -q -x` under a timeout: first those in the fast subset (-m "not slow", the
`slow` marker of pytest.ini), then, if they all pass, the slow ones. A mutation is "killed" when a test
fails (or the run times out), and the report says by which subset: "fast" (what a fork's
`python -m pytest -q tests -m "not slow"` catches) or "slow" (only the full suite does). It "survived" when
they all pass, is "stale" when its exact code is no longer in the file (or is there more than once), and an
"error" when pytest could not run the tests (e.g. a node id that does not exist). Anything but killed is a
failure: exit 1, so the list stays in sync with the code and every mechanism on it keeps a test that pins it.

    python dev/mutate.py                        # all mutations, one at a time; killed/survived, by which
                                                # subset, and the kill rate
    python dev/mutate.py --fast                 # only the fast subset of each entry's tests: which mutations it
                                                # kills alone (the others are "slow only"; exit 1 only if one is
                                                # stale or an error)
    python dev/mutate.py --list                 # the list: name, file, tests
    python dev/mutate.py --only rope_identity   # one (or a comma-separated few)
    python dev/mutate.py --check                # only check that every entry's code is in its file (seconds)
    python dev/mutate.py --jobs 2               # parallel scratch copies (default 1: the suite assumes 2 cores)
    python dev/mutate.py --tests-from /tmp/tests_then --whole-files   # another tests/ folder (e.g. an older
                                                # suite), running the whole files the entries name
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str       # relative to the repository root
    code: str       # exact text, present exactly once in the file
    broken: str     # what it becomes
    tests: tuple    # pytest node ids ("tests/test_x.py::test_y") or "tests/test_x.py -k EXPR"
    claim: str      # the mechanism, in the paper's words


M = Mutation
MUTATIONS = [
    # ---- model.py: the looped transformer (§3.1, §5, App. A, App. C) ----
    M("rope_identity", "model.py",
      "return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)", "return x",
      ("tests/test_model.py -k rope",), "RoPE gives attention the token positions"),
    M("rope_rotates_backwards", "model.py",
      "return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)",
      "return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)",
      ("tests/test_model.py::test_rope_rotates_each_pair_by_position_times_frequency",),
      "RoPE rotates (x_i, x_{i+D/2}) by +t*theta_i"),
    M("rope_base_100", "model.py", "ROPE_BASE = 10000.0", "ROPE_BASE = 100.0",
      ("tests/test_model.py::test_rope_rotates_each_pair_by_position_times_frequency",), "RoPE base 10000"),
    M("no_qk_norm", "model.py",
      "qk = F.rms_norm(qk, (D,), eps=NORM_EPS)",
      "qk = qk * 1.0",
      ("tests/test_model.py::test_qk_norm_makes_attention_independent_of_the_scale_of_wq_and_wk",),
      "parameter-free QK-norm after RoPE"),
    M("relu_not_squared", "model.py", "F.relu(self.c_fc(x)).square()", "F.relu(self.c_fc(x))",
      ("tests/test_model.py::test_block_is_prenorm_attention_then_squared_relu_mlp",), "squared-ReLU MLP"),
    M("post_norm", "model.py", "x = x + self.attn(self.norm_1(x), rope, backend, cache)",
      "x = self.norm_1(x + self.attn(x, rope, backend, cache))",
      ("tests/test_model.py::test_block_is_prenorm_attention_then_squared_relu_mlp",), "pre-norm blocks"),
    M("not_causal", "model.py", "is_causal=True", "is_causal=False",
      ("tests/test_model.py -k test_causal",), "causal attention"),
    M("softcap_30", "model.py", "LOGIT_SOFTCAP = 15.0", "LOGIT_SOFTCAP = 30.0",
      ("tests/test_model.py::test_logits_softcapped",), "logits soft-capped at 15"),
    M("fused_loss_no_cap_slope", "nanoloop/fused_loss.py", "grad_z = probs.mul_(slope).mul_(4 / n)",
      "grad_z = probs.mul_(1 / n)",
      ("tests/test_model.py::test_training_loss_is_the_cross_entropy_of_the_softcapped_logits",),
      "the training loss back-propagates through the soft-cap"),
    M("fused_loss_no_one_hot", "nanoloop/fused_loss.py", "probs[torch.arange(h_block.size(0)), gold_ids] -= 1.0", "probs[:, 0] -= 0.0",
      ("tests/test_model.py::test_training_loss_is_the_cross_entropy_of_the_softcapped_logits",),
      "the cross-entropy's gradient is softmax minus the one-hot target"),
    # ---- cpu_attention.py: the CPU step's attention kernel (the same math as SDPA's) ----
    M("cpu_kernel_not_used", "model.py", 'if name == "cpu" and v.dtype == torch.float32:',
      'if name == "never" and v.dtype == torch.float32:',
      ("tests/test_model.py -k cpu_kernel",), "the CPU backend trains with the kernel"),
    M("cpu_kernel_at_every_head_dim", "model.py", "small_heads = head_dim is None or head_dim <= KERNEL_MAX_HEAD_DIM",
      "small_heads = True", ("tests/test_model.py::test_the_cpu_kernel_is_chosen_only_where_it_is_the_faster_one",),
      "the CPU kernel only where it is measured faster (head dim <= 8), SDPA above"),
    M("cpu_threads_default_all_cores", "nanoloop/runs.py", 'return int(os.environ.get("OMP_NUM_THREADS") or 1)',
      'return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())',
      ("tests/test_train.py::test_a_cpu_run_takes_one_thread_unless_told",),
      "a CPU run takes one thread unless told (two collapse on a busy machine)"),
    M("cpu_kernel_not_causal", "nanoloop/cpu_attention.py", "            p[l] = j <= i0 + l ? e : 0.0f;\n",
      "            p[l] = e;\n", ("tests/test_model.py -k cpu_kernel",), "causal attention, on CPU"),
    M("cpu_kernel_dk_unscaled", "nanoloop/cpu_attention.py", "store_tile(dk, acc_k, j0, a, a->scale);",
      "store_tile(dk, acc_k, j0, a, 1.0f);", ("tests/test_model.py -k cpu_kernel",),
      "the scores' 1/sqrt(D) scale reaches dk"),
    M("cpu_kernel_no_delta", "nanoloop/cpu_attention.py", "ds[l] = p[l] * (dp[l] - a->delta[i]);",
      "ds[l] = p[l] * dp[l];", ("tests/test_model.py -k cpu_kernel",),
      "the softmax's backward subtracts rowsum(P dP)"),
    M("truncation_off", "model.py", "with torch.set_grad_enabled(grad_on and t >= r - r_bwd):",
      "with torch.set_grad_enabled(grad_on):",
      ("tests/test_model.py::test_truncated_bptt_gradient_flows_only_through_the_last_r_bwd_loops",),
      "truncated BPTT: only the last r_bwd loops carry gradient (§5.1)"),
    M("truncation_first_loops", "model.py", "with torch.set_grad_enabled(grad_on and t >= r - r_bwd):",
      "with torch.set_grad_enabled(grad_on and t < r_bwd):",
      ("tests/test_model.py::test_truncated_bptt_same_forward_and_no_grad_in_early_loops",),
      "truncated BPTT keeps the last loops, not the first"),
    M("injection_init_on_s", "model.py", "w_inj[:, :d].copy_(torch.eye(d))",
      "w_inj[:, d:].copy_(torch.eye(d))",
      ("tests/test_model.py::test_linear_injection_starts_as_identity_on_e",), "W_inj starts as [I|0] (u = e)"),
    M("hyper_reads_lane_0", "model.py", "self.hc_alpha[steps, steps % K] = 1.0", "self.hc_alpha[steps, 0] = 1.0",
      ("tests/test_model.py::test_hyperconnections_init_semantics",), "step t reads lane t mod K at init (§5.2)"),
    M("hyper_wraps_beyond_r", "model.py", "step = min(t, self.cfg.r - 1)", "step = t % self.cfg.r",
      ("tests/test_model.py -k test_eval_at_another_loop_count",),
      "beyond the trained r the last hyperconnection step is reused"),
    M("additive_starts_at_e", "model.py",
      'return torch.zeros_like(e) if self.cfg.injection == "additive" else e', "return e",
      ("tests/test_model.py -k test_eval_at_another_loop_count",), "additive injection: s_0 = 0, u = s + e"),
    M("injection_reads_s_e", "model.py", "return weights.w_inj(torch.cat([e, s], dim=-1))",
      "return weights.w_inj(torch.cat([s, e], dim=-1))",
      ("tests/test_model.py -k test_eval_at_another_loop_count",), "linear injection u = W_inj [e; s] (§3.1)"),
    M("hyper_no_lane_mix", "model.py", "lanes = (self.hc_mix[step].float() @ lanes",
      "lanes = (lanes",
      ("tests/test_model.py -k test_eval_at_another_loop_count",), "hyperconnection lanes <- M_t lanes + beta_t s"),
    M("no_recurrent_norm", "model.py", "return weights.norm_recur(u)", "return u",
      ("tests/test_model.py -k test_eval_at_another_loop_count",), "every recurrence ends in the recurrent RMSNorm"),
    M("r_eval_ignored", "model.py", "r = cfg.r if r is None else r", "r = cfg.r",
      ("tests/test_model.py -k test_eval_at_another_loop_count",), "evaluation at another loop count (App. A)"),
    # ---- flops.py: the accounting the law is fitted on (§3.1, truncate-or-not App. D.1) ----
    M("vocab_pad_32", "flops.py", "return -(-self.vocab_size // 64) * 64", "return -(-self.vocab_size // 32) * 32",
      ("tests/test_model.py -k test_vocab_is_padded",), "vocabulary padded to a multiple of 64 (32,064)"),
    M("block_without_norms", "flops.py", "return 12 * d * d + 2 * d", "return 12 * d * d",
      ("tests/test_flops.py -k test_paper_parameter_counts_at_s10",), "n_b = 12 d^2 + 2d"),
    M("w_inj_half", "flops.py", "return 2 * d * d, 2 * d * d, 0  # W_inj", "return d * d, 2 * d * d, 0  # W_inj",
      ("tests/test_flops.py -k test_paper_parameter_counts_at_s10",), "W_inj is d x 2d, part of N_rec"),
    M("n_once_two_norms", "flops.py", "n_once = (cfg.prelude + cfg.coda) * n_b + 3 * d",
      "n_once = (cfg.prelude + cfg.coda) * n_b + 2 * d",
      ("tests/test_flops.py::test_reference_horizon_matches_recipe",), "the three model-level norms are in N_once"),
    M("truncation_saves_no_params_flops", "flops.py", "+ (2 * f + 6 * k) * (cfg.recur * 12 * d * d + inj_matmul))",
      "+ 6 * cfg.r * (cfg.recur * 12 * d * d + inj_matmul))",
      ("tests/test_flops.py::test_truncation_reduces_flops_as_2f_plus_6k",), "F = ... + (2f + 6k)(P_recur + P_inj)"),
    M("truncation_saves_no_attention_flops", "flops.py", "+ (4 * f + 12 * k) * cfg.recur * d * T",
      "+ 12 * cfg.r * cfg.recur * d * T",
      ("tests/test_flops.py::test_truncation_reduces_flops_as_2f_plus_6k",), "attention FLOPs (4f + 12k) l_recur d T"),
    M("budget_floor", "flops.py", "steps = max(1, round(flops / (F * batch_tokens)))",
      "steps = max(1, int(flops / (F * batch_tokens)))",
      ("tests/test_flops.py -k budget",), "steps = round(C / (F B))"),
    M("mfu_one_gpu", "flops.py", "/ (n_gpus * peak)", "/ peak",
      ("tests/test_flops.py -k mfu",), "MFU divides by the peak of every GPU"),
    M("n_eff_linear_in_phi", "flops.py", "return n_once + r ** phi * n_rec", "return n_once + r * phi * n_rec",
      ("tests/test_flops.py::test_section1_equivalence_example",), "N_eff = N_once + r^phi N_rec (Eq. 2)"),
    M("reference_horizon_20x", "flops.py", "return 10 * effective_params(", "return 20 * effective_params(",
      ("tests/test_flops.py::test_reference_horizon_matches_recipe",), "D_ref = 10 x effective params (App. E)"),
    # ---- muonh.py: the optimiser and the LR rule (§4.1, App. E) ----
    M("schedule_constant", "nanoloop/recipe.py", "return 1.0 - (1.0 - final_frac) * progress", "return 1.0",
      ("tests/test_recipe.py::test_the_iso_depth_schedule_is_linear_from_one_to_a_tenth",), "linear decay 1.0 -> 0.1"),
    M("no_sphere_projection", "muonh.py", "p.mul_(radius / torch.linalg.vector_norm(p))", "pass",
      ("tests/test_muonh.py::test_frobenius_norm_is_preserved_for_100_steps",), "W projected back onto ||W_0||_F"),
    M("step_not_relative", "muonh.py", 'p.sub_(direction * (group["lr"] * radius / direction_norm))',
      'p.sub_(direction * (group["lr"] / direction_norm))',
      ("tests/test_muonh.py -k test_relative_step_before_projection_is_lr",), "||dW||_F / ||W||_F = lr"),
    M("no_nesterov", "muonh.py", "update = p.grad.lerp(momentum, mu)", "update = momentum.clone()",
      ("tests/test_muonh.py::test_step_matches_the_recipe_formula_with_nesterov_momentum",), "Nesterov momentum"),
    M("three_ns_steps", "muonh.py", "POLAR_EXPRESS_COEFFICIENTS = polar_express_coefficients()",
      "POLAR_EXPRESS_COEFFICIENTS = polar_express_coefficients(num_steps=3)",
      ("tests/test_muonh.py::test_polar_express_derivation_reproduces_the_papers_coefficients",),
      "5 Newton-Schulz steps (Polar Express)"),
    M("momentum_0_9", "muonh.py", 'lr=BASE_LRS["matrix"], momentum=0.95,', 'lr=BASE_LRS["matrix"], momentum=0.9,',
      ("tests/test_muonh.py::test_build_optimizers_splits_the_groups",), "Nesterov momentum mu = 0.95"),
    M("data_exponent_sign", "muonh.py", "data_factor = (tokens / tokens_ref) ** (-data_exp)",
      "data_factor = (tokens / tokens_ref) ** data_exp",
      ("tests/test_muonh.py::test_transfer_factors_move_the_right_way",), "MuonH LR ~ (D/D_ref)^-0.32"),
    M("muonh_width_factor", "muonh.py", '"matrix": batch_factor * data_factor,',
      '"matrix": batch_factor * data_factor * width_factor,',
      ("tests/test_muonh.py::test_transfer_factors_move_the_right_way",), "MuonH has no width factor"),
    M("adamw_betas", "muonh.py", "ADAMW_BETAS = (0.8, 0.95)", "ADAMW_BETAS = (0.9, 0.95)",
      ("tests/test_muonh.py::test_build_optimizers_splits_the_groups",), "AdamW betas (0.8, 0.95)"),
    # ---- train.py / runs.py: one run of the grid ----
    M("schedule_not_applied", "train.py", 'group["lr"] = group["initial_lr"] * lr_mult',
      'group["lr"] = group["initial_lr"]',
      ("tests/test_train.py -k lr_schedule",), "every step runs at initial_lr x (1 - 0.9 step/(steps-1))"),
    M("validation_on_train_split", "nanoloop/runs.py",
      'run.val_loader = RowLoader(args.data, "val", val_batch, rank, world)',
      'run.val_loader = RowLoader(args.data, "train", val_batch, rank, world)',
      ("tests/test_train.py -k held_out",), "the validation loss is the held-out split's"),
    M("validation_half_the_rows", "nanoloop/runs.py", "run.val_batches = max(1, eval_rows // (val_batch * world))",
      "run.val_batches = max(1, eval_rows // (val_batch * world) // 2)",
      ("tests/test_train.py -k held_out",), "the validation loss averages --eval-rows rows"),
    M("validation_rows_drift", "train.py", "run.val_loader.row = 0", "pass",
      ("tests/test_train.py -k held_out",), "every evaluation reads the same held-out rows"),
    M("eval_r_ignored", "train.py", "total += run.model(x.to(run.device), y.to(run.device), r=r).item()",
      "total += run.model(x.to(run.device), y.to(run.device)).item()",
      ("tests/test_train.py -k held_out",), "--eval-r evaluates at that loop count (App. A)"),
    M("plain_runs_use_the_looped_horizon", "nanoloop/runs.py", "flops.reference_horizon(looped=cfg.r > 1)",
      "flops.reference_horizon(looped=True)",
      ("tests/test_train.py -k test_every_mode_trains",), "r = 1 transfers its LRs from the r = 1 reference"),
    M("lr_horizon_off_by_a_step", "nanoloop/runs.py",
      "learning_rates(cfg.d_model, batch_tokens, steps * batch_tokens,",
      "learning_rates(cfg.d_model, batch_tokens, (steps + 1) * batch_tokens,",
      ("tests/test_train.py -k test_every_mode_trains",), "the MuonH LR's D is the run's tokens"),
    # ---- dataloader.py / prepare_data.py: the rows every architecture reads (§4.1) ----
    M("file_order", "nanoloop/dataloader.py",
      "self._orders = {epoch: np.random.default_rng([self.order_seed, epoch]).permutation(self.n_rows)}",
      "self._orders = {epoch: np.arange(self.n_rows)}",
      ("tests/test_prepare_data.py::test_row_loader_reads_each_row_once_per_pass_in_a_shuffled_order",),
      "rows are read in a seeded permutation"),
    M("same_order_every_pass", "nanoloop/dataloader.py", "np.random.default_rng([self.order_seed, epoch])",
      "np.random.default_rng([self.order_seed])",
      ("tests/test_prepare_data.py::test_row_loader_reads_each_row_once_per_pass_in_a_shuffled_order",),
      "a new permutation every pass"),
    M("row_order_seed", "nanoloop/dataloader.py", "ROW_ORDER_SEED = 1234", "ROW_ORDER_SEED = 4321",
      ("tests/test_train.py -k held_out",), "the data order behind the committed runs (seed 1234)"),
    M("targets_not_shifted", "nanoloop/dataloader.py", "return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()",
      "return rows[:, :-1].contiguous(), rows[:, :-1].contiguous()",
      ("tests/test_prepare_data.py::test_row_loader_batches_are_shifted_rows",), "y is x shifted by one token"),
    M("ranks_take_blocks", "nanoloop/dataloader.py",
      "global_rows = self.row + self.rank + self.world_size * np.arange(self.batch_rows)",
      "global_rows = self.row + self.rank * self.batch_rows + np.arange(self.batch_rows)",
      ("tests/test_prepare_data.py::test_row_loader_ranks_partition_the_single_process_batch",),
      "rank k reads global rows row + k + world * i"),
    M("no_bos", "prepare_data.py", "np.array([tok.bos_id, *ids], np.uint16)", "np.array(ids, np.uint16)",
      ("tests/test_prepare_data.py::test_validation_documents_never_appear_in_train",),
      "every document starts with BOS"),
    M("shortest_first_not_best_fit", "prepare_data.py", "        if fit:\n            longest_that_fits",
      "        if False:\n            longest_that_fits",
      ("tests/test_prepare_data.py::test_best_fit_takes_the_largest_piece_that_fits",),
      "best-fit: the largest piece that fits the space left"),
    M("validation_from_the_first_files", "prepare_data.py", "elif index >= len(files) - val_files:",
      "elif index < val_files:",
      ("tests/test_prepare_data.py::test_download_build_rerun_is_cached_and_deterministic",),
      "validation = the dataset's last shards, whatever --shards is (§4.1)"),
    M("validation_from_the_first_documents", "prepare_data.py",
      "val_from = n_docs - min(math.ceil(val_fraction * n_docs), max(n_docs - 1, 0))",
      "val_from = min(math.ceil(val_fraction * n_docs), max(n_docs - 1, 0))",
      ("tests/test_prepare_data.py::test_validation_documents_never_appear_in_train",),
      "--val-fraction holds out each file's last documents"),
    M("best_fit_ties_take_the_latest", "prepare_data.py",
      "at = bisect.bisect_left(self.keys, (longest_that_fits, -1))", "at = fit - 1",
      ("tests/test_prepare_data.py::test_best_fit_ties_go_to_the_earliest_buffered_piece",
       "tests/test_prepare_data.py::test_micro_corpus_rows_are_the_ones_behind_the_committed_cpu_results"),
      "best-fit ties go to the earliest buffered piece (the committed rows' packing)"),
    M("crop_not_counted", "prepare_data.py", "self.cropped += length - len(piece)", "self.cropped += 0",
      ("tests/test_prepare_data.py::test_when_nothing_fits_the_shortest_is_cropped_and_counted",),
      "what cropping discards is counted"),
    # ---- evaluate.py / eval_tasks.py: the downstream protocol (App. I.1) ----
    M("task_loss_per_item", "evaluate.py", '"loss": nats / tokens,', '"loss": nats / items,',
      ("tests/test_evaluate.py -k row_loss",), "a task's loss is its gold nats over its continuation tokens"),
    M("mc_picks_the_worst", "evaluate.py", "correct = mean.index(min(mean)) == gold",
      "correct = mean.index(max(mean)) == gold",
      ("tests/test_evaluate.py::test_a_model_that_memorised_the_answers_scores_accuracy_one",),
      "MC: the option with the lowest mean loss"),
    M("fewshot_may_be_the_item", "nanoloop/eval_tasks.py", "return [j + 1 if j >= index else j for j in picks]",
      "return picks", ("tests/test_evaluate.py::test_fewshot_draws_are_deterministic_and_never_the_item_itself",),
      "few-shot examples never include the item itself"),
    M("truncation_keeps_the_start", "evaluate.py", "context = context[len(context) - keep:]",
      "context = context[:keep]",
      ("tests/test_evaluate.py::test_nanoloop_v1_left_truncation_keeps_bos_and_the_end_of_the_prompt",),
      "a long prompt loses its start, not its end (nanoloop-v1)"),
    M("core_mc_scores_a_shared_word", "evaluate.py", "starts = [common_prefix(seqs)] * len(seqs)",
      "starts = [common_prefix(seqs) - 1] * len(seqs)",
      ("tests/test_evaluate.py::test_core_multiple_choice_scores_after_the_common_token_prefix",),
      "core MC: the tokens after the options' common token prefix"),
    M("core_schema_scores_only_the_continuation", "evaluate.py",
      "shared = common_prefix([seq[::-1] for seq in seqs])", "shared = len(tokenizer.encode(options[0][1]))",
      ("tests/test_evaluate.py::test_core_schema_scores_the_common_token_suffix",),
      "core schema: the options' common token suffix"),
    M("core_crop_keeps_bos", "evaluate.py", "return seq[-seq_len:], len(continuation), len(seq) > seq_len",
      "return fit_window(bos, context, continuation, seq_len - 1)",
      ("tests/test_evaluate.py::test_core_crop_keeps_the_last_seq_len_tokens_and_bos_may_go",),
      "core: an over-long sequence keeps its last seq_len tokens, BOS included"),
    M("core_lm_space_stays_in_the_prompt", "evaluate.py", "head = [bos] + tokenizer.encode(options[0][0].strip())",
      "head = [bos] + tokenizer.encode(options[0][0])",
      ("tests/test_evaluate.py::test_core_language_modelling_trims_the_context_and_scores_the_delimiters_space",),
      "core LM: the prompt is stripped, the delimiter's space is scored with the continuation"),
    M("core_scores_part_of_a_long_continuation", "evaluate.py", 'if scoring == "core" and longest > seq_len - 1:',
      'if scoring == "core" and longest > 10 * seq_len:',
      ("tests/test_evaluate.py::test_core_refuses_a_continuation_longer_than_the_window",),
      "core: a continuation that does not fit the window is refused, not cut"),
    M("core_items_in_file_order", "nanoloop/eval_tasks.py", "random.Random(SHUFFLE_SEED).shuffle(indices)", "indices.sort()",
      ("tests/test_evaluate.py::test_core_items_are_shuffled_by_1337_and_the_first_n_kept",),
      "core: items shuffled by Random(1337), the first N kept"),
    M("core_shots_from_the_whole_task", "nanoloop/eval_tasks.py",
      "return [selected[j] for j in fewshot_indices(len(selected), position, k)]",
      "return fewshot_indices(n_items, selected[position], k)",
      ("tests/test_evaluate.py::test_core_shots_are_drawn_among_the_shuffled_subsample_by_position",),
      "core: shots drawn among the scored subsample, by position"),
    M("olmo_keeps_unconditional_twins", "nanoloop/eval_tasks.py",
      'requests = [req for req in requests if req["doc_id"] < offset]', "requests = requests",
      ("tests/test_evaluate.py -k unconditional_twins",), "the olmo tasks hold their real items only"),
    M("concurrent_rows_twice", "evaluate.py", "if append_row(args.results, row, ROW_KEY):",
      "if append_row(args.results, row):",
      ("tests/test_evaluate.py::test_concurrent_evaluations_of_one_run_write_each_row_once",),
      "concurrent evaluations write each (run, task, r, shots) row once"),
    # ---- nanoloop/loops.py: sampled recurrence depth (train.py --loops) ----
    M("loops_drawn_per_rank", "nanoloop/loops.py", 'u = random.Random(f"nanoloop-loops:{seed}:{step}").random()',
      'u = random.Random(f"nanoloop-loops:{seed}:{step}:{__import__(\'os\').environ.get(\'RANK\', 0)}").random()',
      ("tests/test_loops.py -k every_rank_and_after_a_resume",), "one loop count per step, the same on every rank"),
    M("loops_flops_at_the_nominal_r", "nanoloop/loops.py",
      "    return sum(p * step_flops_per_token(cfg, loops, t) for t, p in pmf(loops, cfg.r).items())",
      "    return flops.flops_per_token(cfg)",
      ("tests/test_loops.py -k enumerated_distribution",),
      "a budget buys steps at E[F(T, min(B, T))] of the capped distribution"),
    M("loops_gradients_through_all", "nanoloop/loops.py", "    if loops.r_bwd:\n        return min(loops.r_bwd, t)",
      "    if False:\n        return min(loops.r_bwd, t)",
      ("tests/test_loops.py -k above_the_drawn_loops",), "gradients through the last min(B, T) loops"),
    M("loops_whole_model_graph", "nanoloop/runs.py",
      '    return device.type == "cpu" or (loops is not None and loops.kind != "fixed")',
      '    return device.type == "cpu"',
      ("tests/test_loops.py -k compiles_each_block",), "a sampled T compiles per block on GPU, never the whole model"),
    # ---- nanoloop/verdict.py: an ablation's verdict (dev/ablation_report.py), nanoloop/averaging.py ----
    M("verdict_ci_ignores_seeds", "nanoloop/verdict.py", "    if df > 0:\n        variance_of_mean",
      "    if False:\n        variance_of_mean",
      ("tests/test_verdict.py -k t_interval_of_the_seed_spread",),
      "the CI's noise is the seeds' spread within cells: more seeds narrow it"),
    M("verdict_unpaired", "nanoloop/verdict.py",
      "pairs.setdefault(cell, {})[replicate] = float(row[\"val_loss\"]) - float(base[cell][\"val_loss\"])",
      "pairs.setdefault(cell, {})[replicate] = float(row[\"val_loss\"]) - {cell_of(r): float(r[\"val_loss\"]) "
      "for r in base_replicates[0]}[cell]",
      ("tests/test_verdict.py -k pairing_cancels",), "variant and base are paired by cell and seed"),
    M("verdict_word_ignores_ci", "nanoloop/verdict.py", "    if hi < 0:\n", "    if mean < 0:\n",
      ("tests/test_verdict.py -k word_follows_the_interval",), "'better' only when the whole CI lies below 0"),
    M("verdict_base_seeds_beyond_the_variants_unused", "nanoloop/verdict.py",
      "    if all(len(variant) >= 2 and len(base) > len(variant) for",
      "    if all(len(variant) >= 2 and len(base) > 10 ** 9 for",
      ("tests/test_verdict.py -k design_follows_the_seeds",),
      "where the base has more seeds than the variant, the verdict reads all of them"),
    M("verdict_base_control_never_corrects", "nanoloop/verdict.py", "        beta = db / bb\n",
      "        beta = 0 * db / bb\n", ("tests/test_verdict.py -k how_far_they_fell",),
      "the paired seeds are corrected by how far they fell from the base's mean"),
    M("verdict_base_control_without_the_bases_noise", "nanoloop/verdict.py",
      "    variance = sum(s_resid / len(d) + (s_dd - s_resid) / n_base for",
      "    variance = sum(s_resid / len(d) + 0 * (s_dd - s_resid) / n_base for",
      ("tests/test_verdict.py -k how_far_they_fell",), "the control's own noise, the base's mean over its seeds"),
    M("verdict_cells_of_a_seed_independent", "nanoloop/verdict.py",
      "    return max(1.0, statistics.variance(seed_means) / independent)", "    return 1.0",
      ("tests/test_verdict.py -k covarying_cells",), "a seed's covarying cells widen the interval"),
    M("verdict_one_seed_cells_independent", "nanoloop/verdict.py",
      "statistics.stdev(cell_means) / math.sqrt(n_cells) * math.sqrt(inflation)",
      "statistics.stdev(cell_means) / math.sqrt(n_cells)",
      ("tests/test_verdict.py -k one_seed_against",), "one seed's covarying cells widen its interval too"),
    M("init_draws_by_seed_alone", "model.py", 'manual_seed(zlib.crc32(f"{seed}:{name}".encode()))',
      'manual_seed(zlib.crc32(f"{seed}".encode()))', ("tests/test_model.py -k initial_draws_by_name",),
      "each weight its own draw, seeded by the seed and its name"),
    M("init_draws_by_name_by_default", "model.py", 'def __init__(self, cfg: ModelConfig, seed=0, draws="global"):',
      'def __init__(self, cfg: ModelConfig, seed=0, draws="by-name"):', ("tests/test_model.py -k initial_draws_by_name",),
      "the default draws from the global RNG, as every committed run"),
    M("paired_init_leaves_the_draws_global", "dev/ablate.sh", "  RECIPE_FLAGS+=(--init-draws by-name)\n", "  :\n",
      ("tests/test_ablation.py -k paired_init",), "--paired-init trains every arm with --init-draws by-name"),
    M("plan_total_of_the_last_arm", "dev/ablation_report.py", '    runs = sum(arm["to_train"] for arm in arms)',
      '    runs = arms[-1]["to_train"]',
      ("tests/test_ablation.py -k plans_total_adds",), "--plan's total counts every arm's runs, replicates too"),
    M("ablate_grid_ignored_by_the_variant", "dev/ablate.sh", '  "$1" "$OUT" "$ARM_GRID" "$NAME"',
      '  "$1" "$OUT" cpu-micro "$NAME"', ("tests/test_ablation.py -k case_study_grid",),
      "--grid gives the variant the case-study grid's per-r runs"),
    M("ablate_no_check_before_writing", "dev/ablate.sh", "CHECK_ONLY=1\nevery_arm plan_arm\n", "CHECK_ONLY=1\n",
      ("tests/test_ablation.py -k rerun_with_other_flags",),
      "a rerun with other flags is refused before the finished report is touched"),
    M("power_from_one_cell_not_the_replicates", "dev/ablation_report.py",
      "    sds, n_replicates = replicate_seed_sd(base) if quick else ({}, 0)", "    sds, n_replicates = {}, 0",
      ("tests/test_ablation.py -k plans_power_is_the_half_width",),
      "--plan's power reads the base's replicates at the quick cells"),
    M("nothing_changed_ignores_the_bases_replicates", "dev/ablation_report.py",
      "    if len(found) < 2:\n        return {}\n    first", "    if True:\n        return {}\n    first",
      ("tests/test_ablation.py -k quiet_arms_report",),
      "on the quiet recipe \"nothing changed\" is the base at another seed, not a retrain"),
    M("average_not_evaluated", "train.py", "        run.average.copy_to_model()", "        pass",
      ("tests/test_averaging.py -k resume_inside_the_window",), "--average-last evaluates the mean weights"),
    M("average_off_the_sphere", "nanoloop/averaging.py",
      "                value = mean * (radius / torch.linalg.vector_norm(mean).clamp_min(1e-30))",
      "                value = mean",
      ("tests/test_averaging.py -k uniform_mean_of_the_window",), "averaged matrices go back on MuonH's sphere"),
    # ---- laws.py / fit_laws.py: the fits (§4.2, App. E, G.2, I.1) ----
    M("ci_quartiles", "nanoloop/laws.py",
      "return [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]",
      "return [float(np.percentile(draws, 25)), float(np.percentile(draws, 75))]",
      ("tests/test_fit_laws.py -k percentiles_of_its_draws",), "95% percentile CIs (App. G.2)"),
    M("untied_read_as_shared", "nanoloop/laws.py",
      'arrays["r"][[is_untied(row) for row in rows]] = 1.0',
      'arrays["r"][[is_untied(row) for row in rows]] *= 1.0',
      ("tests/test_fit_laws.py -k untied_model_is_the_anchor",), "the untied model is read at r^phi = 1 (App. E.2)"),
    M("bootstrap_runs_not_cells", "nanoloop/laws.py", "return counts[cell_of_run].astype(float), rng",
      "return counts[np.arange(len(cell_of_run)) % len(counts)].astype(float), rng",
      ("tests/test_fit_laws.py -k whole_cells",), "the bootstrap resamples whole (budget, r) cells (App. G.2)"),
    M("category_sum", "nanoloop/eval_tasks.py", "sum(losses[task] for task in tasks) / len(tasks)",
      "sum(losses[task] for task in tasks)",
      ("tests/test_evaluate.py::test_rows_per_run_task_and_r_and_a_rerun_loads_nothing",),
      "a category's loss is the mean of its tasks' losses (App. I.1)"),
    M("objective_ignores_phi", "nanoloop/laws.py", 'neff = prob["n_once"] + rphi * prob["n_rec"]',
      'neff = prob["n_once"] + prob["n_rec"]',
      ("tests/test_fit_laws.py::test_reference_points_phi_0_and_1_recovered",),
      "the joint law's N_once + r^phi N_rec"),
    # ---- recipe.py, flops.py, truncate_law.py, allocation.py, model.py: Truncate or Not? (issues 42, 43) ----
    M("ladder_step_96", "nanoloop/recipe.py", "24, 32, 48, 64, 88, 128", "24, 32, 48, 64, 96, 128",
      ("tests/test_recipe.py -k table_13_batch",), "their batch ladder (..., 64, 88, 128, ...; Table 13)"),
    M("token_exponent_032", "nanoloop/recipe.py", 'Recipe("truncate-or-not", data_exp=0.40', 'Recipe("truncate-or-not", data_exp=0.32',
      ("tests/test_recipe.py -k table_13_peak_lrs",), "the re-estimated LR token exponent 0.40 (App. F)"),
    M("no_warmup", "nanoloop/recipe.py", "        return (step + 1) / warmup", "        return 1.0",
      ("tests/test_recipe.py -k warms_up",), "2% linear warmup"),
    M("budget_folds_by_flops", "nanoloop/truncate_law.py", 'return float(row["tokens_target"]) / float(row["d0"])',
      'return float(row["flops_per_token"]) * float(row["tokens"])',
      ("tests/test_truncate_law.py -k held_out_folds",), "budget folds group the target token level D_target/D0"),
    M("optimizer_term_half_gram", "flops.py", "newton_schulz += NS_ITERATIONS * (4 * m * m * n + 2 * m ** 3)",
      "newton_schulz += NS_ITERATIONS * (2 * m * m * n + 2 * m ** 3)",
      ("tests/test_flops.py -k optimizer_term",), "the measured compute counts every Newton-Schulz matmul (Table 6)"),
    M("backward_loop_costs_one_unit", "nanoloop/truncate_law.py", "comp = (1 - share) + share * (2 * np.asarray(T, float) + 4 * np.asarray(B, float)) / 6",
      "comp = (1 - share) + share * (2 * np.asarray(T, float) + 2 * np.asarray(B, float)) / 6",
      ("tests/test_allocate.py -k table_5",), "a backward loop costs twice a forward loop (6 N_comp, Eq. 4)"),
    M("best_b_by_argmax", "nanoloop/truncate_law.py", "b_star = int(np.argmin(by_b)) + 1", "b_star = int(np.argmax(by_b)) + 1",
      ("tests/test_allocate.py -k table_5",), "B* minimises chi (Table 5)"),
    M("fixed_size_worst_first", "nanoloop/allocation.py", 'rows.sort(key=lambda row: row["L"])', 'rows.sort(key=lambda row: -row["L"])',
      ("tests/test_allocate.py -k fixed_size",), "at a fixed size the best setting has the lowest loss (§7.1)"),
    M("untied_shares_the_loop", "model.py", "if not self.cfg.untied or t == 0:", "if True:",
      ("tests/test_model.py -k untied",), "the untied model runs each loop's own copy (App. E.2)"),
    # ---- laws.py, fit_laws.py, dev/ablation_report.py: honest intervals, ablations you can preview (issue 45) ----
    M("ci_at_bound_shown_as_interval", "nanoloop/laws.py",
      '        return f"{text} ({whose} reaches the bound{plural} {edges}: not identified)"',
      '        return f"{text} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"',
      ("tests/test_fit_laws.py::test_a_ci_at_the_search_bound_is_printed_as_not_identified_and_flagged_in_the_json",
       "tests/test_study.py::test_readme_phi_table_is_the_committed_fits"),
      "a CI that reaches the fitter's search bound is not identified, not an interval"),
    M("delta_phi_reads_one_arm", "fit_laws.py",
      'laws.ci_bounds_reached("phi", analysis["bootstrap"]["phi_ci"], other["bootstrap"]["phi_ci"])',
      'laws.ci_bounds_reached("phi", other["bootstrap"]["phi_ci"])',
      ("tests/test_fit_laws.py::test_delta_phi_with_an_arm_at_the_search_bound_is_not_identified",),
      "delta-phi is not identified where either arm's phi CI reaches the bound"),
    M("loop_flag_given_to_r1_anchors", "dev/ablation_report.py",
      "            if group not in left_out and model_refusal(parser, name, args + group):", "            if False:",
      ("tests/test_ablation.py -k loop_flag_that_means_nothing",),
      "a loop flag with no meaning at r = 1 leaves the r = 1 anchors as they are"),
    M("failed_ablation_report_not_refused", "dev/ablation_report.py",
      "    if (out / INCOMPLETE).is_file() and not rows_only:", "    if False:",
      ("tests/test_ablation.py::test_a_failed_ablation_is_marked_incomplete_and_its_report_refused",),
      "a failed ablation leaves no folder that reads as a result"),
    M("stop_waits_for_the_accumulated_step", "train.py", "if micro > 0 and WORLD == 1 and STOP.is_set():", "if False:",
      ("tests/test_train.py::test_a_stop_mid_step_drops_the_step_and_resumes_exactly",),
      "a stop drops the step in flight at its next micro-batch instead of finishing the accumulation"),
    M("dropped_step_keeps_its_rng", "train.py", "torch.set_rng_state(cpu_rng)", "cpu_rng = cpu_rng",
      ("tests/test_train.py::test_a_stop_mid_step_drops_the_step_and_resumes_exactly",),
      "a dropped step's RNG draws are undone, so the resumed run is the uninterrupted one"),
    M("second_ctrl_c_waits", "nanoloop/common.py", "if received and signum == signal.SIGINT:", "if False:",
      ("tests/test_train.py::test_a_second_ctrl_c_exits_at_once_and_keeps_the_last_whole_checkpoint",),
      "a second Ctrl-C exits at once without a checkpoint"),
    # ---- model.py, engine.py, export_hf.py: a looped model at test time (issue 44) ----
    M("adaptive_exit_tried_on_hyper_runs", "dev/loop_curves.py",
      'exitable = [entry for entry in entries if entry["info"]["injection"] != "hyper"]', "exitable = entries",
      ("tests/test_generate.py -k loop_curves",),
      "adaptive exit is measured where a token's state can exit (not hyperconnections' lanes), chosen up front"),
    M("exited_state_moves_on", "model.py",
      "s = torch.where(active[..., None], self.run_shared(self.inject(e, s, weights), rope, cache, weights), s)",
      "s = self.run_shared(self.inject(e, s, weights), rope, cache, weights)",
      ("tests/test_generate.py -k keeps_its_state",), "an exited token keeps its state while the batch loops on"),
    M("exited_keys_not_kept", "nanoloop/engine.py",
      "k = torch.where(keep, self.k[self.previous[slot], :, :, self.first:self.pos], k)", "k = torch.where(keep, k, k)",
      ("tests/test_generate.py -k keeps_its_state",), "later tokens read an exited token's keys of its last loop"),
    M("exit_ignores_min_loops", "model.py", "if previous is not None and t + 1 >= rule.min_loops:",
      "if previous is not None:",
      ("tests/test_generate.py -k within_the_bounds",), "no token exits before min_loops"),
    M("export_weights_not_under_gpt", "export_hf.py",
      'return {f"gpt.{name}": tensor.detach().contiguous() for name, tensor in model.state_dict().items()}',
      'return {f"model.{name}": tensor.detach().contiguous() for name, tensor in model.state_dict().items()}',
      ("tests/test_export.py::test_logits_are_model_py_s_exactly",), "the export's weights are the run's"),
    M("export_rope_tables_not_rebuilt", "export_hf.py", "module.rope_cos.copy_(cos)", "module.rope_cos.copy_(sin)",
      ("tests/test_export.py::test_logits_are_model_py_s_exactly",), "RoPE's tables are rebuilt on load"),
    M("export_num_loops_not_trained_r", "export_hf.py",
      '"num_loops": mean_loops(run["loops"], cfg.r),', '"num_loops": 1,',
      ("tests/test_export.py::test_logits_are_model_py_s_exactly",), "the exported model runs the trained loop count"),
    # ---- dev/gpu_check.py: the GPU record's projection ----
    M("projection_accumulates_the_optimizer", "dev/gpu_check.py",
      "accum * tokens / (accum * fwd_bwd_s + optimizer_s)", "accum * tokens / (accum * (fwd_bwd_s + optimizer_s))",
      ("tests/test_gpu_check.py::test_tiny_run_measures_every_configuration",),
      "at 2^18 the optimiser runs once per accumulated batch"),
]


# ----------------------------------------------------------------------------------------------

def check(mutation, root=REPO):
    """None if the mutation applies to `root`, else why it does not ("stale: ...")."""
    path = Path(root) / mutation.file
    if not path.exists():
        return f"stale: {mutation.file} does not exist"
    found = path.read_text().count(mutation.code)
    if found != 1:
        return f"stale: the code is {'not' if found == 0 else f'{found} times'} in {mutation.file}"
    return None


def repository_files(root):
    """The working tree as git sees it: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [name for name in listed if name and (Path(root) / name).is_file()]


def make_scratch(files, tests_from):
    """A copy of the repository in a temp folder; tests/ replaced by `tests_from` if given."""
    scratch = Path(tempfile.mkdtemp(prefix="nanoloop-mutate-"))
    for name in files:
        if tests_from and name.startswith("tests/"):
            continue
        dest = scratch / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest)
    if tests_from:
        shutil.copytree(tests_from, scratch / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    return scratch


def pytest_args(tests, whole_files):
    """The pytest command-line targets of an entry's tests (whole files: each named file once, no -k)."""
    if whole_files:
        return list(dict.fromkeys(test.split("::")[0].split()[0] for test in tests))
    args, k_exprs = [], []
    for test in tests:
        target, _, expr = test.partition(" -k ")
        args.append(target)
        if expr:
            k_exprs.append(f"({expr})")
    if k_exprs:  # a -k applies to every target: node ids are kept by naming their test in it
        names = [t.split("::")[1] for t in args if "::" in t]
        args = list(dict.fromkeys(t.split("::")[0] for t in args))
        args += ["-k", " or ".join(k_exprs + names)]
    return args


RUNNING = set()  # the pytest processes in flight: stopped with their children on SIGTERM / Ctrl-C


FAST, SLOW = ["-m", "not slow"], ["-m", "slow"]  # the two subsets of a mutation's tests (pytest.ini's marker)
NO_TESTS = 5  # pytest's exit code when the selection holds no test (e.g. -m "not slow" of slow tests only)


def run_pytest(targets, scratch, timeout):
    """(exit code or "timeout", output lines) of `python -m pytest -q -x targets` in `scratch`. pytest runs in
    its own process group, so a timeout stops the torchrun / mp.spawn processes it started as well."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *targets]
    proc = subprocess.Popen(cmd, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return "timeout", []
    finally:
        RUNNING.discard(proc)
    return proc.returncode, out.strip().splitlines()


def stop(proc):
    """SIGKILL a pytest run and its process group (every process it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def run_mutation(mutation, scratch, timeout, whole_files, fast_only=False):
    """Apply one mutation in `scratch`, run its fast tests, then (unless they kill it, or fast_only) its slow
    ones; restore the file. Returns (outcome, subset that killed it or "-", seconds, detail)."""
    path = scratch / mutation.file
    original = path.read_text()
    why = check(mutation, scratch)
    if why:
        return "stale", "-", 0.0, why
    path.write_text(original.replace(mutation.code, mutation.broken))
    t0 = time.time()
    targets = pytest_args(mutation.tests, whole_files)
    try:
        outcome, detail = verdict(*run_pytest(targets + FAST, scratch, timeout), timeout)
        subset = "fast"
        if outcome in ("survived", "no tests") and not fast_only:
            slow_outcome, slow_detail = verdict(*run_pytest(targets + SLOW, scratch, timeout), timeout)
            if slow_outcome != "no tests":  # else the fast run's answer stands
                outcome, detail, subset = slow_outcome, slow_detail, "slow"
    finally:
        path.write_text(original)
    seconds = time.time() - t0
    if outcome != "killed":
        subset = "-"
    if fast_only and outcome in ("survived", "no tests"):  # only the full suite can catch it
        if outcome == "no tests":
            detail = "none of its tests is in the fast subset"
        else:
            detail = f"its fast tests pass: {detail}"
        outcome = "slow only"
    if outcome == "no tests":  # neither subset holds a test: the entry's ids match nothing
        outcome, detail = "error", f"no test matches {' '.join(targets)}"
    return outcome, subset, seconds, detail


def verdict(code, tail, timeout):
    """(outcome, detail) of one pytest run of a mutated copy: killed, survived, no tests or error."""
    last = tail[-1] if tail else ""
    if code == "timeout":
        return "killed", f"timed out after {timeout} s"
    if code == 1:
        failed = next((line for line in tail if line.startswith("FAILED")), last)
        return "killed", failed
    if code == 2 and "error" in last:  # a collection error: the mutated module no longer imports
        return "killed", last
    if code == 0:
        return "survived", last
    if code == NO_TESTS:
        return "no tests", last
    return "error", f"pytest exit {code}: {last}"


def baseline_passes(chosen, scratch, args):
    """Every chosen entry's tests pass unmutated (else a failing test would 'kill' every mutation): the
    entries' plain targets in one pytest run, each -k selection in its own (with --fast, their fast subset)."""
    runs, plain = [], []
    for m in chosen:
        targets = pytest_args(m.tests, args.whole_files)
        if "-k" in targets:
            runs.append(targets)
        else:
            plain += [t for t in targets if t not in plain]
    runs = ([plain] if plain else []) + list(dict.fromkeys(map(tuple, runs)))
    for targets in runs:
        code, tail = run_pytest(list(targets) + (FAST if args.fast else []), scratch, args.timeout)
        if code != 0 and not (args.fast and code == NO_TESTS):
            first = next((x for x in tail if x.startswith(("FAILED", "ERROR"))), tail[-1] if tail else code)
            print(f"mutate.py: the unmutated tests fail ({' '.join(targets)[:200]}): {first}")
            return False
    print(f"baseline: the tests of the {len(chosen)} mutations pass unmutated ({len(runs)} pytest runs)", flush=True)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated mutation names")
    p.add_argument("--list", action="store_true", help="print the mutations and exit")
    p.add_argument("--check", action="store_true", help="only check that every entry applies (no tests run)")
    p.add_argument("--jobs", type=int, default=1, help="mutations run in parallel, each in its own scratch copy")
    p.add_argument("--timeout", type=float, default=900, help="seconds per mutation's test run")
    p.add_argument("--tests-from", default="", help="a tests/ folder to use instead of the repository's")
    p.add_argument("--whole-files", action="store_true", help="run the whole test files an entry names, not its "
                                                               "node ids (for a tests folder without those tests)")
    p.add_argument("--no-baseline", action="store_true", help="skip the first run of every chosen test unmutated "
                                                               "(a test that fails there would 'kill' every mutation)")
    p.add_argument("--fast", action="store_true", help='run only the fast subset of each entry\'s tests (-m "not '
                                                       'slow"): which mutations it kills alone')
    args = p.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown or len({m.name for m in MUTATIONS}) != len(MUTATIONS) or args.jobs < 1:
        print(f"mutate.py: unknown mutation {', '.join(sorted(unknown))}" if unknown else
              "mutate.py: --jobs must be >= 1 and the names unique", file=sys.stderr)
        return 2
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    if args.list:
        for m in chosen:
            print(f"{m.name:<38} {m.file:<17} {m.claim}\n{'':<38} tests: {', '.join(m.tests)}")
        return 0
    if args.check:
        stale = [(m, check(m)) for m in chosen if check(m)]
        for m, why in stale:
            print(f"{m.name:<38} {why}")
        print(f"{len(chosen) - len(stale)}/{len(chosen)} mutations apply")
        return 1 if stale else 0
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # SystemExit: the scratch folders go too
    tests_from = Path(args.tests_from).resolve() if args.tests_from else None
    scratches = []
    try:
        for _ in range(min(args.jobs, len(chosen))):
            scratches.append(make_scratch(repository_files(REPO), tests_from))
        if not args.no_baseline and not baseline_passes(chosen, scratches[0], args):
            return 1
        results = run_all(chosen, scratches, args)
    finally:
        for proc in list(RUNNING):
            stop(proc)
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)
    return summary(chosen, results, args.fast)


def summary(chosen, results, fast_only):
    """The kill rate and which subset killed what; the exit status (0: every mutation killed; with --fast, 0
    unless one is stale or an error)."""
    outcomes = {name: outcome for name, (outcome, _) in results.items()}
    killed = sum(outcome == "killed" for outcome in outcomes.values())
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("killed", "slow only", "survived", "stale", "error")}
    by_slow = [name for name, (outcome, subset) in results.items() if outcome == "killed" and subset == "slow"]
    slow_only = [name for name, outcome in outcomes.items() if outcome == "slow only"] + by_slow
    which = "the fast subset alone kills" if fast_only else "kill rate"
    print(f"\n{which} {killed}/{len(chosen)} = {100 * killed / len(chosen):.0f}% "
          f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)})")
    if not fast_only:
        print(f"killed by the fast subset (-m \"not slow\"): {killed - len(by_slow)}; "
              f"only by slow tests: {len(by_slow)}")
    if slow_only:
        print(f"only the full suite catches: {', '.join(slow_only)}")
    if fast_only:
        return 0 if counts["stale"] + counts["error"] == 0 else 1
    return 0 if killed == len(chosen) else 1


def run_all(chosen, scratches, args):
    """Every chosen mutation, each in a free scratch copy (len(scratches) at a time); {name: (outcome, subset)}."""
    free, results = list(scratches), {}
    width = max(len(m.name) for m in chosen)

    def one(m):
        scratch = free.pop()
        try:
            outcome, subset, seconds, detail = run_mutation(m, scratch, args.timeout, args.whole_files, args.fast)
        finally:
            free.append(scratch)
        results[m.name] = (outcome, subset)
        print(f"{m.name:<{width}}  {outcome:<9} {subset:<4} {seconds:6.0f}s  {detail[:150]}", flush=True)

    pool = ThreadPoolExecutor(len(scratches))
    try:
        for future in [pool.submit(one, m) for m in chosen]:
            future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(RUNNING):
            stop(proc)
        pool.shutdown(wait=True)
    return results


if __name__ == "__main__":
    sys.exit(main())

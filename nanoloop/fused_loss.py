"""
The training loss of a CPU step, fused: lm_head, the logits' soft-cap and the cross-entropy over blocks of
rows, with the gradients computed in the same pass. It is model.py's loss, not an approximation of it
(tests/test_model.py: equal in value and every gradient to F.cross_entropy of softcapped_logits); it exists
because at the CPU grids' widths (d = 8-48) the (tokens x vocab) logits, not the transformer, cost most of an
eager step: read from memory a dozen times by the plain formula, from cache a few times here. GPU runs use
the plain formula, which torch.compile fuses (model.py, GPT.forward).
"""
import torch
import torch.nn.functional as F


class LinearSoftcapCrossEntropy(torch.autograd.Function):
    """The training loss on CPU: mean cross-entropy of the soft-capped logits cap tanh(h W^T / cap) against the
    targets, what lm_head + softcapped_logits + F.cross_entropy compute, in blocks of rows whose logits fit
    in a core's cache, with the gradients of h and W computed in the same pass: no (tokens x vocab) tensor
    is ever stored, and the logits' elementwise passes, which dominate a CPU step at small widths, run from
    cache (dev/bench_train.py). The same matmuls as lm_head's forward and backward (flops.py's count).
    Two identities carry the arithmetic: c tanh(z / c) = 2c sigmoid(2z / c) - c (CPU's sigmoid is ~6x its
    tanh), and the cap bounds every logit by c = 15, so the softmax needs no max-shift (V e^15 is far below
    fp32's overflow)."""

    @staticmethod
    def forward(ctx, h, weight, targets, vocab_size, cap):
        n, padded = h.size(0), weight.size(0)
        grad_h, grad_weight_t = None, None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_h = torch.empty_like(h)
            # W's gradient is summed as its transpose (d x vocab), h_block^T grad_z: MKL's gemm at these shapes
            # is 2-8x slower reading grad_z transposed (grad_z^T h_block), the 128-row blocks' largest cost at
            # d = 8 (dev/bench_train.py). For the same reason grad_z multiplies W through its transposed copy.
            grad_weight_t = h.new_zeros(h.size(1), padded)
            weight_t = weight.t().contiguous()
        rows = max(64, 2 ** 18 // padded)  # 2^18 fp32 logits: 1 MiB, one core's L2
        total = h.new_zeros(())
        for first in range(0, n, rows):
            h_block, gold_ids = h[first:first + rows], targets[first:first + rows]
            z = torch.mm(h_block, weight.t())  # (rows, padded vocab), as lm_head
            gate = z[:, :vocab_size].mul_(2 / cap).sigmoid_()  # sigmoid(2z / 15), in place
            probs = gate.mul(2 * cap).sub_(cap).exp_()  # exp of the capped logits
            sum_exp = probs.sum(-1, keepdim=True)
            gold = gate.gather(1, gold_ids[:, None]).mul_(2 * cap).sub_(cap)
            total += (sum_exp.log() - gold).sum()
            if grad_h is None:
                continue
            probs.div_(sum_exp)  # the softmax
            probs[torch.arange(h_block.size(0)), gold_ids] -= 1.0  # d loss / d capped logit = softmax - one-hot
            slope = gate.sub_(gate.square())  # d capped / dz = 1 - tanh^2 = 4 sigmoid (1 - sigmoid)
            grad_z = probs.mul_(slope).mul_(4 / n)
            if padded > vocab_size:  # the vocabulary's padding columns get no gradient
                grad_z = F.pad(grad_z, (0, padded - vocab_size))
            torch.mm(grad_z, weight_t.t(), out=grad_h[first:first + rows])
            grad_weight_t += torch.mm(h_block.t(), grad_z)  # an mm, as lm_head's backward (FlopCounterMode's count)
        ctx.save_for_backward(grad_h, None if grad_weight_t is None else grad_weight_t.t().contiguous())
        return total / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_weight = ctx.saved_tensors
        return grad_h * grad_loss, grad_weight * grad_loss, None, None, None

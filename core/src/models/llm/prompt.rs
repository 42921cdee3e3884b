//! What sd.cpp feeds each family's LLM encoder and what it takes from it: the chat
//! template around the user's prompt, the byte range A1111 weights apply to, how many
//! leading tokens (the template's system part) are dropped from the hidden states, the
//! padding, and which hidden states (sd.cpp's `conditioner.hpp`, `LLMEmbedder`).

use std::ops::Range;

/// A family whose text encoder is an LLM, as far as its text-to-image prompt goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Qwen3-4B, `hidden_states[-2]`.
    ZImage,
    /// Qwen3-4B/8B, hidden states 9, 18 and 27 side by side, padded to 512 tokens.
    Flux2Klein,
    /// Qwen2.5-VL-7B, the final state, the 34-token system part dropped.
    QwenImage,
}

/// One prompt laid out for an LLM encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmPrompt {
    /// The templated text.
    pub text: String,
    /// The user's prompt inside `text`, in bytes: where A1111 weights are parsed.
    pub attn: Range<usize>,
    /// Leading tokens dropped from the hidden states.
    pub drop: usize,
    /// Tokens the sequence is padded to (with `<|endoftext|>`, masked).
    pub min_length: usize,
    /// Hidden states taken, as sd.cpp numbers them (the output of the first k layers;
    /// layers + 1 is the final normed state).
    pub out_layers: Vec<usize>,
}

const QWEN_IMAGE_SYSTEM: &str = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";

impl Family {
    /// `prompt` laid out for this family's encoder of `layers` layers.
    pub fn layout(self, prompt: &str, layers: usize) -> LlmPrompt {
        let (head, tail, drop, min_length, out_layers) = match self {
            Family::ZImage => ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", 0, 0, vec![layers.saturating_sub(1).max(1)]),
            Family::Flux2Klein => ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 0, 512, vec![9, 18, 27]),
            Family::QwenImage => (QWEN_IMAGE_SYSTEM, "<|im_end|>\n<|im_start|>assistant\n", 34, 0, vec![layers + 1]),
        };
        LlmPrompt { text: format!("{head}{prompt}{tail}"), attn: head.len()..head.len() + prompt.len(), drop, min_length, out_layers }
    }
}

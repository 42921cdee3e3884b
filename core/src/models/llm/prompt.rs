//! What sd.cpp feeds each family's LLM encoder and what it takes from it: the chat
//! template around the user's prompt, the byte range A1111 weights apply to, how many
//! leading tokens (the template's system part) are dropped from the hidden states, the
//! padding (of the tokens, or of the states after), and which hidden states (sd.cpp's `conditioner.hpp`, `LLMEmbedder`).

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
    /// Mistral-Small-3.2-24B, hidden states 10, 20 and 30 side by side, the states (not
    /// the tokens) padded to 512 with zeros.
    Flux2Dev,
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
    /// Rows the states are padded to with zeros after the drop (sd.cpp's
    /// `hidden_states_min_length`).
    pub pad_states: usize,
}

const FLUX2_DEV_SYSTEM: &str = "[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You give structured responses focusing on object relationships, object\nattribution and actions without speculation.[/SYSTEM_PROMPT][INST]";

const QWEN_IMAGE_SYSTEM: &str = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";

impl Family {
    /// `prompt` laid out for this family's encoder of `layers` layers.
    pub fn layout(self, prompt: &str, layers: usize) -> LlmPrompt {
        let pad_states = if self == Family::Flux2Dev { 512 } else { 0 };
        let (head, tail, drop, min_length, out_layers) = match self {
            Family::ZImage => ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", 0, 0, vec![layers.saturating_sub(1).max(1)]),
            Family::Flux2Klein => ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 0, 512, vec![9, 18, 27]),
            Family::QwenImage => (QWEN_IMAGE_SYSTEM, "<|im_end|>\n<|im_start|>assistant\n", 34, 0, vec![layers + 1]),
            Family::Flux2Dev => (FLUX2_DEV_SYSTEM, "[/INST]", 0, 0, vec![10, 20, 30]),
        };
        LlmPrompt { text: format!("{head}{prompt}{tail}"), attn: head.len()..head.len() + prompt.len(), drop, min_length, out_layers, pad_states }
    }

    /// The vocabulary the family's encoder reads.
    pub fn tokenizer(self) -> std::result::Result<crate::text::llm::LlmTokenizer, crate::text::TextError> {
        match self {
            Family::Flux2Dev => crate::text::llm::LlmTokenizer::mistral(),
            Family::ZImage | Family::Flux2Klein | Family::QwenImage => crate::text::llm::LlmTokenizer::qwen(),
        }
    }
}

/// ComfyUI's Qwen-Image template for a prompt with one image (`llama_template_images_en`,
/// TextEncodeQwenImageEdit): `{}` is the user's text.
pub const QWEN_IMAGE_EDIT_TEMPLATE: &str = "<|im_start|>system\nYou are a Prompt optimizer designed to rewrite user inputs into high-quality Prompts that are more complete and expressive while preserving the original meaning.\nTask Requirements:\n1. For overly brief user inputs, reasonably infer and add details to enhance the visual completeness without altering the core content;\n2. Refine descriptions of subject characteristics, visual style, spatial relationships, and shot composition;\n3. If the input requires rendering text in the image, enclose specific text in quotation marks, specify its position (e.g., top-left corner, bottom-right corner) and style. This text should remain unaltered and not translated;\n4. Match the Prompt to a precise, niche style aligned with the user's intent. If unspecified, choose the most appropriate style (e.g., realistic photography style);\n5. Please ensure that the Rewritten Prompt is less than 200 words.\n\nDescribe the key features of the input image (color, shape, size, texture, objects, background), then explain how the user's text instruction should alter or modify the image. Generate a new image that meets the user's requirements while maintaining consistency with the original input where appropriate. Add \"Ultra HD, 4K, cinematic composition\" to enhance quality.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n";

/// ComfyUI's TextEncodeQwenImageEditPlus template (Edit-2509/2511): `{}` is the pictures'
/// markers (`Picture k: <|vision_start|><|image_pad|><|vision_end|>`) followed by the
/// user's text.
pub const QWEN_IMAGE_EDIT_PLUS_TEMPLATE: &str = "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, background), then explain how the user's text instruction should alter or modify the image. Generate a new image that meets the user's requirements while maintaining consistency with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";

/// sd.cpp's Qwen-Image edit prompt (`QwenImageEditPlusPipeline`, whichever Edit model):
/// the Edit-Plus template with `Picture k: <|vision_start|><|image_pad|><|vision_end|>` per
/// image before the user's text, A1111 weights inside it, the final state, the 64-token
/// system part dropped.
pub fn qwen_image_edit_layout(prompt: &str, images: usize, layers: usize) -> LlmPrompt {
    let (head, tail) = QWEN_IMAGE_EDIT_PLUS_TEMPLATE.split_once("{}").expect("the template has a slot");
    let pictures: String = (1..=images).map(|k| format!("Picture {k}: <|vision_start|><|image_pad|><|vision_end|>")).collect();
    let start = head.len() + pictures.len();
    LlmPrompt { text: format!("{head}{pictures}{prompt}{tail}"), attn: start..start + prompt.len(), drop: 64, min_length: 0, out_layers: vec![layers + 1], pad_states: 0 }
}

/// Qwen's `<|im_start|>`, and the `user` and newline tokens after it.
const IM_START: u32 = 151_644;
const USER: u32 = 872;
const NEWLINE: u32 = 198;

/// Qwen2-VL's image pad token: one per merged vision token.
pub const IMAGE_PAD: u32 = 151_655;

/// Where ComfyUI's Qwen-Image encoder cuts the template off (`QwenImageTEModel`): at the
/// second `<|im_start|>`, past the `user` and newline that follow it.
pub fn comfy_template_end(ids: &[u32]) -> usize {
    let mut end = 0;
    for (i, _) in ids.iter().enumerate().filter(|(_, &t)| t == IM_START).take(2) {
        end = i;
    }
    if ids.len() > end + 3 && ids[end + 1] == USER && ids[end + 2] == NEWLINE {
        end += 3;
    }
    end
}

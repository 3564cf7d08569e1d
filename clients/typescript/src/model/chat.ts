/**
 * Chat messages through the draft's chat template (edge/eos.py's chat_template_of, edge/
 * openai_request.py's render_chat): rendered with @huggingface/jinja as the Python SDK renders
 * it with jinja2 (trim_blocks, lstrip_blocks, a generation prompt, empty bos/eos), then encoded.
 */

import { Template } from "@huggingface/jinja";

import type { DraftFiles } from "./files.js";

export interface ChatMessage {
  role: string;
  /** A string, or text parts (joined with newlines, as the Python SDK and vLLM do). */
  content: string | { type: string; text?: string }[];
}

export const CHAT_TEMPLATE_FILE = "chat_template.jinja";

/** The draft directory's chat template: chat_template.jinja, else tokenizer_config.json's; null when it has none. */
export async function chatTemplateOf(files: DraftFiles): Promise<string | null> {
  const jinja = await files.text(CHAT_TEMPLATE_FILE);
  if (jinja && jinja.trim()) return jinja;
  const config = await files.text("tokenizer_config.json");
  if (!config) return null;
  let template: unknown;
  try {
    template = JSON.parse(config).chat_template;
  } catch {
    return null;
  }
  if (Array.isArray(template)) {
    const named = new Map(template.filter((t) => t && typeof t === "object").map((t) => [t.name, t.template]));
    template = named.get("default") ?? named.values().next().value;
  }
  return typeof template === "string" && template.trim() ? template : null;
}

function messageText(content: ChatMessage["content"], where: string): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content) || content.length === 0) throw new TypeError(`${where} must be a string or a non-empty array of text parts`);
  return content.map((part, i) => {
    if (part?.type !== "text") throw new TypeError(`${where}[${i}] is a ${JSON.stringify(part?.type ?? "untyped")} part: only 'text' parts are supported`);
    if (typeof part.text !== "string") throw new TypeError(`${where}[${i}] is a text part without a string 'text'`);
    return part.text;
  }).join("\n");
}

/** The prompt text of `messages` under `template`, with the assistant's turn opened. */
export function renderChat(template: string, messages: readonly ChatMessage[]): string {
  if (!Array.isArray(messages) || messages.length === 0) throw new TypeError("messages must be a non-empty list of {role, content}");
  const checked = messages.map((message, i) => {
    if (!message || typeof message.role !== "string") throw new TypeError(`messages[${i}] must have a string 'role' and a 'content'`);
    return { ...message, content: messageText(message.content, `messages[${i}].content`) };
  });
  return new Template(template).render({ messages: checked, add_generation_prompt: true, bos_token: "", eos_token: "" });
}

// Streaming one chat completion: POST /v1/chat/completions with "stream": true, read its
// server-sent events and fold each delta into the reply being shown.

/** The error message of a failed HTTP response (OpenAI's {"error": {"message"}} when present). */
async function failure(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error?.message;
    if (message) return `HTTP ${response.status}: ${message}`;
  } catch {
    // not JSON: report the text itself
  }
  return `HTTP ${response.status}: ${text.slice(0, 300) || response.statusText}`;
}

/** Add one chunk's delta to `reply` ({content, reasoning, toolCalls}); its finish_reason, if any. */
function applyChunk(chunk, reply) {
  if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
  const choice = chunk.choices?.[0];
  if (!choice) return null;
  const delta = choice.delta || {};
  if (delta.content) reply.content += delta.content;
  const reasoning = delta.reasoning_content ?? delta.reasoning;
  if (reasoning) reply.reasoning += reasoning;
  for (const call of delta.tool_calls || []) {
    const index = call.index ?? reply.toolCalls.length;
    const target = (reply.toolCalls[index] ??= { id: "", name: "", arguments: "" });
    if (call.id) target.id = call.id;
    if (call.function?.name) target.name += call.function.name;
    if (call.function?.arguments) target.arguments += call.function.arguments;
  }
  return choice.finish_reason || null;
}

/**
 * Stream the completion of `body` into `reply`, calling `onUpdate` after each event that changed it.
 * Resolves with the finish reason; rejects with an Error saying what failed (HTTP status and the
 * server's message, or an error event in the stream), or an AbortError when `signal` aborts.
 */
export async function streamChat(body, headers, signal, reply, onUpdate) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...headers },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw new Error(await failure(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let finish = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer = (buffer + value).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return finish;
      finish = applyChunk(JSON.parse(data), reply) ?? finish;
      onUpdate();
    }
  }
  return finish;
}

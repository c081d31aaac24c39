// The chat page: conversations kept in localStorage, replies streamed from /v1/chat/completions.
import { renderMarkdown } from "./markdown.js";
import { streamChat } from "./stream.js";

const STORAGE = { conversations: "atlas.chat.conversations", current: "atlas.chat.current", settings: "atlas.chat.settings" };
const $ = (id) => document.getElementById(id);
const elements = {
  sidebarList: $("conversations"),
  newChat: $("new-chat"),
  model: $("model"),
  settingsToggle: $("settings-toggle"),
  settings: $("settings"),
  apiKey: $("api-key"),
  systemPrompt: $("system-prompt"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  tools: $("tools"),
  status: $("status"),
  messages: $("messages"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
};

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function save(key, value) {
  localStorage.setItem(key, JSON.stringify(value));
}

const state = {
  conversations: load(STORAGE.conversations, []),
  currentId: load(STORAGE.current, null),
  settings: load(STORAGE.settings, {}),
  controller: null, // the AbortController of the reply being streamed
};

function current() {
  return state.conversations.find((c) => c.id === state.currentId) ?? null;
}

function persist() {
  save(STORAGE.conversations, state.conversations);
  save(STORAGE.current, state.currentId);
}

function showStatus(text) {
  elements.status.textContent = text;
}

function authHeaders() {
  const key = (state.settings.apiKey || "").trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// ---- settings -----------------------------------------------------------------------------

const SETTING_FIELDS = { apiKey: "apiKey", systemPrompt: "system", temperature: "temperature", maxTokens: "maxTokens", tools: "tools" };

function bindSettings() {
  for (const [element, key] of Object.entries(SETTING_FIELDS)) {
    elements[element].value = state.settings[key] ?? "";
    elements[element].addEventListener("change", () => {
      state.settings[key] = elements[element].value;
      save(STORAGE.settings, state.settings);
      if (key === "apiKey") loadModels();
    });
  }
  elements.settingsToggle.addEventListener("click", () => toggleSettings(elements.settings.hidden));
}

function toggleSettings(open) {
  elements.settings.hidden = !open;
  elements.settingsToggle.setAttribute("aria-expanded", String(open));
}

/** The request's optional fields from the settings, or throws an Error naming the bad field. */
function requestOptions() {
  const options = {};
  const { temperature, maxTokens, tools } = state.settings;
  if (temperature !== undefined && temperature !== "") options.temperature = Number(temperature);
  if (maxTokens !== undefined && maxTokens !== "") options.max_tokens = Number(maxTokens);
  if (tools && tools.trim()) {
    let parsed;
    try {
      parsed = JSON.parse(tools);
    } catch (error) {
      throw new Error(`Settings → Tools is not valid JSON: ${error.message}`);
    }
    if (!Array.isArray(parsed)) throw new Error("Settings → Tools must be a JSON array of tools");
    options.tools = parsed;
  }
  return options;
}

// ---- models -------------------------------------------------------------------------------

const MODELS_RETRY_MS = 1000; // how often the list is asked for again while the model loads (503)

let modelsRetry = null; // the pending retry of loadModels, at most one

async function loadModels() {
  clearTimeout(modelsRetry);
  let response;
  try {
    response = await fetch("/v1/models", { headers: authHeaders() });
  } catch (error) {
    showStatus(`Cannot reach the server: ${error.message}`);
    return;
  }
  if (response.status === 401) {
    showStatus("This server needs an API key: enter it under Settings.");
    toggleSettings(true);
    elements.apiKey.focus();
    return;
  }
  if (response.status === 503) {
    showStatus("The model is still loading; it appears here when it is ready.");
    modelsRetry = setTimeout(loadModels, MODELS_RETRY_MS);
    return;
  }
  if (!response.ok) {
    showStatus(`Listing the models failed: HTTP ${response.status}`);
    return;
  }
  const models = (await response.json()).data.map((m) => m.id);
  elements.model.replaceChildren(...models.map((id) => new Option(id, id)));
  const wanted = current()?.model ?? state.settings.model;
  if (models.includes(wanted)) elements.model.value = wanted;
  showStatus("");
}

// ---- conversations ------------------------------------------------------------------------

function newConversation() {
  stopReply();
  const conversation = { id: crypto.randomUUID(), title: "New chat", messages: [] };
  state.conversations.unshift(conversation);
  state.currentId = conversation.id;
  persist();
  renderAll();
  elements.prompt.focus();
}

function openConversation(id) {
  stopReply();
  state.currentId = id;
  persist();
  renderAll();
}

function deleteConversation(id) {
  if (id === state.currentId) stopReply();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (id === state.currentId) state.currentId = state.conversations[0]?.id ?? null;
  persist();
  renderAll();
}

function renderSidebar() {
  const items = state.conversations.map((conversation) => {
    const item = element("li", conversation.id === state.currentId ? "current" : "");
    const open = element("button", "open", conversation.title);
    open.type = "button";
    open.title = conversation.title;
    open.addEventListener("click", () => openConversation(conversation.id));
    const remove = element("button", "delete", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Delete ${conversation.title}`);
    remove.addEventListener("click", () => deleteConversation(conversation.id));
    item.append(open, remove);
    return item;
  });
  elements.sidebarList.replaceChildren(...items);
}

// ---- messages -----------------------------------------------------------------------------

const views = new WeakMap(); // message -> its DOM parts

/** A new `tag` element of class `className`, holding `text` (as text, never HTML) when given. */
function element(tag, className, text) {
  const made = document.createElement(tag);
  if (className) made.className = className;
  if (text !== undefined) made.textContent = text;
  return made;
}

function messageView(message) {
  let view = views.get(message);
  if (view) return view;
  const root = element("div", `message ${message.role}`);
  const role = element("div", "role", message.role === "user" ? "You" : message.model || "Assistant");
  const reasoning = element("details", "reasoning");
  const reasoningText = element("div", "reasoning-text");
  reasoning.append(element("summary", "", "Reasoning"), reasoningText);
  const content = element("div", "content");
  const tools = element("div", "tool-calls");
  const note = element("div", "note");
  root.append(role, reasoning, content, tools, note);
  view = { root, reasoning, reasoningText, content, tools, note };
  views.set(message, view);
  return view;
}

function toolCallView(call) {
  const box = element("div", "tool-call");
  box.append(
    element("div", "tool-name", `Tool call: ${call.name || "…"}`),
    element("pre", "tool-arguments", prettyJson(call.arguments)),
  );
  return box;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text; // still streaming, or not JSON
  }
}

const NOTES = { stopped: "Stopped.", length: "Stopped at the token limit." };

function updateMessage(message) {
  const view = messageView(message);
  if (message.role === "user") {
    view.content.textContent = message.content;
    view.reasoning.hidden = true;
  } else {
    view.root.dataset.state = message.state || "done";
    view.content.innerHTML = renderMarkdown(message.content || "");
    view.reasoning.hidden = !message.reasoning;
    view.reasoningText.textContent = message.reasoning || "";
    view.tools.replaceChildren(...(message.toolCalls || []).map(toolCallView));
  }
  view.note.replaceChildren();
  if (message.error) {
    view.note.append(element("span", "error", message.error));
  } else if (NOTES[message.state]) {
    view.note.textContent = NOTES[message.state];
  }
  return view.root;
}

function renderMessages() {
  const conversation = current();
  elements.messages.replaceChildren(...(conversation?.messages ?? []).map(updateMessage));
  elements.messages.scrollTop = elements.messages.scrollHeight;
}

function renderAll() {
  renderSidebar();
  renderMessages();
  const model = current()?.model;
  if (model && [...elements.model.options].some((o) => o.value === model)) elements.model.value = model;
}

// ---- sending ------------------------------------------------------------------------------

/** The conversation as OpenAI chat messages (failed or empty replies left out). */
function apiMessages(conversation) {
  const messages = [];
  const system = (state.settings.system || "").trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conversation.messages) {
    if (m.role === "user") {
      messages.push({ role: "user", content: m.content });
    } else if (m.content || m.toolCalls?.length) {
      const message = { role: "assistant", content: m.content || "" };
      if (m.toolCalls?.length) {
        message.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
      }
      messages.push(message);
    }
  }
  return messages;
}

function setStreaming(streaming) {
  elements.send.disabled = streaming;
  elements.stop.hidden = !streaming;
}

async function send(text) {
  let options;
  try {
    options = requestOptions();
  } catch (error) {
    showStatus(error.message);
    return;
  }
  if (!current()) newConversation();
  const conversation = current();
  const model = elements.model.value;
  conversation.model = model;
  state.settings.model = model;
  save(STORAGE.settings, state.settings);
  if (conversation.messages.length === 0) conversation.title = text.slice(0, 60);
  const question = { role: "user", content: text };
  conversation.messages.push(question);
  const body = { model, messages: apiMessages(conversation), stream: true, ...options };
  const reply = { role: "assistant", model, content: "", reasoning: "", toolCalls: [], state: "streaming" };
  conversation.messages.push(reply);
  persist();
  renderSidebar();
  elements.messages.append(updateMessage(question), updateMessage(reply));
  elements.messages.scrollTop = elements.messages.scrollHeight;
  showStatus("");

  const controller = new AbortController();
  state.controller = controller;
  setStreaming(true);
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const atBottom = elements.messages.scrollHeight - elements.messages.scrollTop - elements.messages.clientHeight < 40;
      updateMessage(reply);
      if (atBottom) elements.messages.scrollTop = elements.messages.scrollHeight;
    });
  };
  try {
    const finish = await streamChat(body, authHeaders(), controller.signal, reply, redraw);
    reply.state = finish === "length" ? "length" : "done";
  } catch (error) {
    if (controller.signal.aborted) {
      reply.state = "stopped";
    } else {
      reply.state = "error";
      reply.error = error.message;
    }
  } finally {
    if (state.controller === controller) state.controller = null;
    setStreaming(false);
    persist();
    updateMessage(reply);
  }
}

function stopReply() {
  state.controller?.abort();
}

// ---- start --------------------------------------------------------------------------------

elements.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = elements.prompt.value.trim();
  if (!text || state.controller) return;
  elements.prompt.value = "";
  send(text);
});
elements.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    elements.composer.requestSubmit();
  }
});
elements.stop.addEventListener("click", stopReply);
elements.newChat.addEventListener("click", newConversation);
elements.model.addEventListener("change", () => {
  state.settings.model = elements.model.value;
  save(STORAGE.settings, state.settings);
});

// A reply that was streaming when the page was closed ended then.
for (const message of state.conversations.flatMap((c) => c.messages)) {
  if (message.state === "streaming") message.state = "stopped";
}
if (!current()) state.currentId = state.conversations[0]?.id ?? null;
bindSettings();
renderAll();
setStreaming(false);
loadModels();
document.documentElement.dataset.ready = "true";

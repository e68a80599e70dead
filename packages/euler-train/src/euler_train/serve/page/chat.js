// The euler chat page: streams replies from /v1/chat/completions and shows each token with the model's
// probability of it (colour) and the alternatives it beat (click a token). Nothing is fetched but this
// server's own API.
"use strict";

const $ = (id) => document.getElementById(id);
const messages = [];  // the conversation, as the API takes it
const replies = [];   // per assistant turn: {tokens: [{token, logprob, top}], ttft_s, tokens_per_s, finish}
let running = null;   // the AbortController of the reply being streamed

function setting(id) { return Number($(id).value); }

function headers() {
  const key = $("api_key").value;
  return key ? {"content-type": "application/json", authorization: `Bearer ${key}`} : {"content-type": "application/json"};
}

function colour(logprob) {  // green when likely, red when unlikely
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)} 70% 80%)`;
}

function addTurn(role, text) {
  const turn = document.createElement("div");
  turn.className = `turn ${role}`;
  turn.innerHTML = `<div class="who">${role}</div><div class="text"></div><div class="stats"></div>`;
  turn.querySelector(".text").textContent = text;
  $("conversation").appendChild(turn);
  turn.scrollIntoView({block: "end"});
  return turn;
}

function showToken(entry, span) {
  document.querySelectorAll(".tok.chosen").forEach((s) => s.classList.remove("chosen"));
  span.classList.add("chosen");
  const rows = entry.top_logprobs.map((alt) => {
    const p = (100 * Math.exp(alt.logprob)).toFixed(1);
    const picked = alt.token === entry.token ? ' class="picked"' : "";
    return `<tr${picked}><td>${JSON.stringify(alt.token)}</td><td>${p}%</td></tr>`;
  });
  const p = (100 * Math.exp(entry.logprob)).toFixed(2);
  let drafting = "";
  if (entry.drafted === true) {
    drafting = "<p class=\"drafting\">Drafted by the MTP heads and accepted: head 0 agreed, so this token " +
      "took no forward of its own.</p>";
  } else if (entry.drafted === false && entry.rejected_draft !== null && entry.rejected_draft !== undefined) {
    drafting = `<p class="drafting">Head 0's own choice; the heads had drafted ` +
      `<code>${JSON.stringify(entry.rejected_draft)}</code> here, which it turned down.</p>`;
  } else if (entry.drafted === false) {
    drafting = "<p class=\"drafting\">Head 0's own choice.</p>";
  }
  $("detail").innerHTML = `<p>token <code>${JSON.stringify(entry.token)}</code>: probability <b>${p}%</b></p>` +
    drafting + `<table><tr><th>alternatives</th><th>p</th></tr>${rows.join("")}</table>`;
  $("hint").hidden = true;
}

function addToken(text, entry, reply) {
  const span = document.createElement("span");
  span.className = entry.drafted ? "tok drafted" : "tok";
  span.textContent = entry.token;
  span.style.background = colour(entry.logprob);
  span.title = `${(100 * Math.exp(entry.logprob)).toFixed(1)}%`;
  span.addEventListener("click", () => showToken(entry, span));
  text.appendChild(span);
  reply.tokens.push(entry);
}

async function* events(response) {  // the data of each server-sent event
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {done, value} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) if (line.startsWith("data: ")) yield line.slice(6);
    }
  }
}

async function send(content) {
  messages.push({role: "user", content});
  addTurn("user", content);
  const turn = addTurn("assistant", "");
  const text = turn.querySelector(".text");
  const reply = {tokens: [], ttft_s: null, tokens_per_s: null, finish: null};
  replies.push(reply);
  const body = {
    model: "euler", messages, stream: true, logprobs: true, top_logprobs: setting("top_logprobs"),
    temperature: setting("temperature"), top_p: setting("top_p"), max_tokens: setting("max_tokens"),
  };
  running = new AbortController();
  $("send").disabled = true; $("stop").disabled = false; $("status").textContent = "";
  const start = performance.now();
  let answer = "";
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body),
      signal: running.signal,
    });
    if (!response.ok) throw new Error((await response.json()).error.message);
    for await (const data of events(response)) {
      if (data === "[DONE]") break;
      const choice = JSON.parse(data).choices[0];
      if (!choice) continue;
      for (const entry of (choice.logprobs && choice.logprobs.content) || []) {
        if (reply.ttft_s === null) reply.ttft_s = (performance.now() - start) / 1000;
        addToken(text, entry, reply);
      }
      answer += choice.delta.content || "";
      if (choice.finish_reason) reply.finish = choice.finish_reason;
    }
  } catch (err) {
    if (err.name !== "AbortError") $("status").textContent = `error: ${err.message}`;
    reply.finish = reply.finish || "stopped";
  } finally {
    running = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
  const seconds = (performance.now() - start) / 1000;
  const after = seconds - (reply.ttft_s || 0);
  reply.tokens_per_s = reply.tokens.length > 1 && after > 0 ? (reply.tokens.length - 1) / after : null;
  const drafted = reply.tokens.filter((e) => e.drafted).length;
  const speculating = reply.tokens.some((e) => e.drafted !== undefined);
  turn.querySelector(".stats").textContent =
    `${reply.tokens.length} tokens, first after ${(reply.ttft_s || 0).toFixed(2)} s, ` +
    `${reply.tokens_per_s ? reply.tokens_per_s.toFixed(1) : "–"} tokens/s, ended: ${reply.finish}` +
    (speculating ? `; ${drafted} were drafts of the MTP heads that head 0 accepted (underlined)` : "");
  turn.dataset.done = "true";
  messages.push({role: "assistant", content: answer});
}

function conversationJson() {
  return JSON.stringify({model: $("model").textContent, messages, replies}, null, 2);
}

$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const content = $("message").value.trim();
  if (!content || running) return;
  $("message").value = "";
  send(content);
});
$("message").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); }
});
$("stop").addEventListener("click", () => running && running.abort());
$("clear").addEventListener("click", () => {
  messages.length = 0; replies.length = 0; $("conversation").innerHTML = ""; $("detail").innerHTML = "";
});
$("copy").addEventListener("click", () => navigator.clipboard.writeText(conversationJson()));
$("download").addEventListener("click", () => {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([conversationJson()], {type: "application/json"}));
  link.download = "euler-conversation.json";
  link.click();
});
fetch("v1/models", {headers: headers()}).then((r) => r.json())
  .then((m) => { $("model").textContent = m.data ? m.data[0].id : ""; });

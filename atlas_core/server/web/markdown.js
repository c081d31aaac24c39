// A small Markdown renderer for model output.
//
// Contract: renderMarkdown(text) returns HTML in which every character of `text` is escaped
// (& < > " ') before any markup is added, so model output can never inject tags, attributes or
// scripts. The markup recognised: fenced code blocks (an unclosed fence, as while streaming, runs
// to the end), indented-free paragraphs (single newlines kept as line breaks), ATX headings,
// block quotes, bulleted and numbered lists (one level), tables (a header row, a |---| delimiter
// row with optional :alignment:, then body rows), horizontal rules, inline code, bold, italic,
// strikethrough and links whose target is http:, https: or mailto: (others stay text).

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** `text` with the five HTML-significant characters escaped. */
export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const FENCE = /^\s{0,3}(```+|~~~+)\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const TABLE_DELIMITER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_LINK = /^(https?:|mailto:)/i;
// Inline code spans are swapped out for these markers while the other inline rules run.
const MARK = "\u0000";

/** HTML of one line or paragraph of inline Markdown (already split into blocks). */
function renderInline(text) {
  const spans = [];
  let html = escapeHtml(text).replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, __, code) => {
    spans.push(`<code>${code.trim() === "" ? code : code.replace(/^ (.*) $/s, "$1")}</code>`);
    return `${MARK}${spans.length - 1}${MARK}`;
  });
  html = html
    .replace(/\[([^\]\n]+)\]\(([^()\s]+)\)/g, (whole, label, target) =>
      SAFE_LINK.test(target) ? `<a href="${target}" target="_blank" rel="noopener noreferrer">${label}</a>` : whole,
    )
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)([\s\S]*?\S)__(?!\w)/g, "<strong>$1</strong>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>")
    .replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/\n/g, "<br>");
  return html.replace(new RegExp(`${MARK}(\\d+)${MARK}`, "g"), (_, index) => spans[Number(index)]);
}

/** A list starting at `lines[start]`: [html, index of the first line after it]. */
function renderList(lines, start, pattern, tag) {
  const items = [];
  let i = start;
  while (i < lines.length) {
    const match = lines[i].match(pattern);
    if (match) {
      items.push(match[match.length - 1]);
    } else if (lines[i].trim() !== "" && /^\s+/.test(lines[i]) && items.length) {
      items[items.length - 1] += `\n${lines[i].trim()}`;
    } else {
      break;
    }
    i += 1;
  }
  const first = tag === "ol" ? Number(lines[start].match(NUMBERED)[1]) : 1;
  const attributes = first !== 1 ? ` start="${first}"` : "";
  return [`<${tag}${attributes}>${items.map((item) => `<li>${renderInline(item)}</li>`).join("")}</${tag}>`, i];
}

/** The cells of one table row (`| a | b |` or `a | b`). */
function tableCells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((cell) => cell.trim());
}

/** Whether a table starts at `lines[i]`: a row with a pipe, then a delimiter row of as many cells. */
function startsTable(lines, i) {
  return (
    i + 1 < lines.length &&
    lines[i].includes("|") &&
    TABLE_DELIMITER.test(lines[i + 1]) &&
    tableCells(lines[i]).length === tableCells(lines[i + 1]).length
  );
}

/** The table starting at `lines[start]` (see `startsTable`): [html, index of the first line after it]. */
function renderTable(lines, start) {
  const header = tableCells(lines[start]);
  const aligns = tableCells(lines[start + 1]).map((cell) =>
    cell.endsWith(":") ? (cell.startsWith(":") ? "center" : "right") : cell.startsWith(":") ? "left" : "",
  );
  const row = (cells, tag) =>
    `<tr>${header
      .map((_, index) => {
        const align = aligns[index] ? ` class="align-${aligns[index]}"` : ""; // the CSP forbids style attributes
        return `<${tag}${align}>${renderInline(cells[index] ?? "")}</${tag}>`;
      })
      .join("")}</tr>`;
  const body = [];
  let i = start + 2;
  while (i < lines.length && lines[i].trim() !== "" && lines[i].includes("|")) {
    body.push(row(tableCells(lines[i]), "td"));
    i += 1;
  }
  return [`<table><thead>${row(header, "th")}</thead><tbody>${body.join("")}</tbody></table>`, i];
}

/** Whether `line` starts a block other than a paragraph. */
function startsBlock(line) {
  return [FENCE, HEADING, RULE, QUOTE, BULLET, NUMBERED].some((pattern) => pattern.test(line));
}

/** The HTML of Markdown `text` (see the contract at the top of this file). */
export function renderMarkdown(text) {
  const lines = String(text).replaceAll(MARK, "").replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let match;
    if ((match = line.match(FENCE))) {
      const fence = match[1];
      const language = match[2];
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1;
      const languageClass = language ? ` class="language-${escapeHtml(language)}"` : "";
      out.push(`<pre><code${languageClass}>${escapeHtml(body.join("\n"))}</code></pre>`);
    } else if ((match = line.match(HEADING))) {
      const level = match[1].length;
      out.push(`<h${level}>${renderInline(match[2])}</h${level}>`);
      i += 1;
    } else if (startsTable(lines, i)) {
      let html;
      [html, i] = renderTable(lines, i);
      out.push(html);
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i += 1;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (match = lines[i].match(QUOTE))) {
        quoted.push(match[1]);
        i += 1;
      }
      out.push(`<blockquote>${renderMarkdown(quoted.join("\n"))}</blockquote>`);
    } else if (BULLET.test(line)) {
      let html;
      [html, i] = renderList(lines, i, BULLET, "ul");
      out.push(html);
    } else if (NUMBERED.test(line)) {
      let html;
      [html, i] = renderList(lines, i, NUMBERED, "ol");
      out.push(html);
    } else if (line.trim() === "") {
      i += 1;
    } else {
      const paragraph = [];
      while (
        i < lines.length &&
        lines[i].trim() !== "" &&
        (paragraph.length === 0 || !(startsBlock(lines[i]) || startsTable(lines, i)))
      ) {
        paragraph.push(lines[i]);
        i += 1;
      }
      out.push(`<p>${renderInline(paragraph.join("\n"))}</p>`);
    }
  }
  return out.join("\n");
}

// DOM: elements and text nodes only. Everything the API returns goes through append() as a text node, never
// as HTML, so an object name or a log line that looks like markup stays text (app.js says why).

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  return append(el, children);
}

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  return append(el, children);
}

export function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren();
  append(main, nodes);
}

export function safeHref(url) {
  return typeof url === "string" && /^https?:\/\//.test(url) ? url : null;
}

export const enc = encodeURIComponent;

export function setLive(state) {
  const el = document.getElementById("live");
  el.hidden = state === null;
  el.classList.toggle("on", state === true);
  el.textContent = state ? "live" : "reconnecting";
  el.dataset.state = state === null ? "" : state ? "live" : "reconnecting";
}

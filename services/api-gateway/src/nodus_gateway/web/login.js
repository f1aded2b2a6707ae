// Signing in, and what the page shows when a request fails: the login prompt again for a refused token,
// the gateway's Status (its message, fix and docs) for anything else.

import { ApiError } from "./api.js";
import { h, setLive, show } from "./dom.js";
import { endView, forgetToken, signIn } from "./session.js";
import { errorBox } from "./widgets.js";

export function showLogin(status) {
  document.getElementById("sign-out").hidden = true;
  setLive(null);
  const input = h("input", {
    id: "token-input",
    type: "password",
    autocomplete: "off",
    placeholder: "bearer token",
    "aria-label": "Bearer token",
  });
  const form = h(
    "form",
    { id: "login-form" },
    input,
    h("button", { type: "submit", id: "sign-in" }, "Sign in"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const given = input.value.trim();
    if (!given) return;
    signIn(given);
  });
  show(
    h(
      "section",
      { class: "login panel", id: "login" },
      h("h1", {}, "Sign in to Nodus"),
      h(
        "p",
        {},
        "Paste a bearer token. It is kept in this browser tab only and sent to the gateway's API in the ",
        h("code", {}, "Authorization"),
        " header, never as a cookie; closing the tab forgets it.",
      ),
      h(
        "p",
        { class: "hint" },
        "The local stack's admin token is NODUS_TOKEN in .nodus/local.env (written by make up); ",
        "an admin mints others with POST /apis/nodus.dev/v1/tokens.",
      ),
      status ? errorBox(status) : null,
      form,
    ),
  );
  input.focus();
}

export function failed(error) {
  if (error instanceof ApiError && error.code === 401) {
    // The token is wrong or revoked: forget it and ask again, with the gateway's reason and fix.
    forgetToken();
    endView();
    showLogin(error.status);
    return;
  }
  setLive(null);
  const status = error instanceof ApiError ? error.status : { message: String(error) };
  show(h("section", {}, h("h1", {}, "Something went wrong"), errorBox(status)));
}

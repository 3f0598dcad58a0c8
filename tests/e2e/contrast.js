// WCAG 2.1 (1.4.3) luminance and contrast, computed in the page on every element
// that holds visible text, against the first opaque background up the tree.
function channel(c) { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); }
function rgba(text) { const m = text.match(/[\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; }
function luminance(c) { return 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]); }
function background(el) {
  for (let e = el; e; e = e.parentElement) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c[3] >= 1) return c;
  }
  return [255, 255, 255, 1];
}
const out = [];
for (const el of document.querySelectorAll('body *')) {
  const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
  const style = getComputedStyle(el);
  if (!own || parseFloat(style.fontSize) === 0 || style.visibility === 'hidden' || style.display === 'none' || el.offsetParent === null) continue;
  const fg = rgba(style.color), bg = background(el);
  const [a, b] = [luminance(fg), luminance(bg)].sort((x, y) => y - x);
  const ratio = (a + 0.05) / (b + 0.05);
  const size = parseFloat(style.fontSize), bold = parseInt(style.fontWeight) >= 700;
  const large = size >= 24 || (bold && size >= 18.66);
  if (ratio < (large ? 3 : 4.5)) out.push(el.tagName.toLowerCase() + '.' + el.className + ' "'
      + el.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2) + ':1');
}
return out;

// Inline code breaks only between words (custom.css), so one token wider than its box (a long
// path in a note) would run past the box's edge. Such a token, and only such a token, may break
// after a slash, an equals sign or a colon, where a reader of a path or a flag expects a break;
// copying it still gives the token whole (<wbr> adds no character). Checked again on resize.
function breakLongTokens() {
  document.querySelectorAll(':not(pre) > code').forEach(code => {
    const box = code.closest('div.admonition, td, th, li, p') || code.parentElement;
    const style = getComputedStyle(box);
    const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
    nodes.forEach(node => {
      const range = document.createRange();
      range.selectNodeContents(node);
      if (!/[\/=:]./.test(node.data) || range.getBoundingClientRect().width <= room) return;
      const pieces = node.data.split(/(?<=[\/=:])(?=.)/);
      const parent = node.parentNode;
      pieces.forEach((piece, index) => {
        if (index) parent.insertBefore(document.createElement('wbr'), node);
        const whole = document.createElement('span');  // no break inside a piece ("--")
        whole.style.whiteSpace = 'nowrap';
        whole.textContent = piece;
        parent.insertBefore(whole, node);
      });
      parent.removeChild(node);
      parent.style.whiteSpace = 'normal';  // a span.pre is nowrap, which ignores <wbr>
    });
  });
}
window.addEventListener('load', breakLongTokens);
window.addEventListener('resize', breakLongTokens);
